//! rdma_cm plumbing: an event channel read asynchronously, its events
//! routed to whoever waits for them.
//!
//! librdmacm reports the events of every connection accepted from a
//! listener on the listener's channel (sideway cannot migrate ids), so one
//! dispatcher task per channel reads all events and routes each by its
//! identifier: connection requests to the listener's accept queue, the rest
//! to the connection (or set-up step) registered for that id. Events are
//! acknowledged as soon as they are read (sideway's `Event` acks on drop), so
//! an id can always be destroyed.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex, Weak};

use sideway::rdmacm::communication_manager::{
    EventChannel, EventType, GetEventErrorKind, Identifier,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, mpsc};

use super::ChannelFd;
use crate::transport::TransportError;

/// What a routed event says; `Event` itself is not `Send`, this is.
pub(super) struct CmEvent {
    pub kind: EventType,
    pub status: i32,
    /// For a connection request: the new connection's id.
    pub id: Option<Arc<Identifier>>,
}

struct Route {
    id: Weak<Identifier>,
    to: mpsc::UnboundedSender<CmEvent>,
}

impl std::fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmEvent")
            .field("kind", &self.kind)
            .field("status", &self.status)
            .finish()
    }
}

/// One event channel and its dispatcher.
pub(super) struct CmChannel {
    channel: Arc<EventChannel>,
    routes: Mutex<Vec<Route>>,
    requests: Mutex<Option<mpsc::UnboundedSender<CmEvent>>>,
    stop: Arc<Notify>,
}

impl Drop for CmChannel {
    fn drop(&mut self) {
        self.stop.notify_one();
    }
}

impl std::fmt::Debug for CmChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmChannel").finish_non_exhaustive()
    }
}

/// The error when no RDMA stack or device is there: what `--transport auto`
/// takes as the signal to use tcp.
pub(super) fn unavailable(what: &str, e: impl std::fmt::Display) -> TransportError {
    TransportError::Unavailable(format!("{what}: {e}"))
}

impl CmChannel {
    /// Opens a channel and starts its dispatcher on the current runtime.
    pub fn open() -> Result<Arc<CmChannel>, TransportError> {
        let channel = EventChannel::new().map_err(|e| unavailable("no RDMA stack (rdma_cm)", e))?;
        channel
            .set_nonblocking(true)
            .map_err(|e| TransportError::Io(format!("rdma_cm channel: {e}")))?;
        // SAFETY: `ChannelFd` owns a reference to the channel, so the fd
        // stays open and unchanged while registered.
        let fd = unsafe {
            AsyncFd::register_with_interest(ChannelFd(Arc::clone(&channel)), Interest::READABLE)
        }
        .map_err(|e| TransportError::Io(format!("rdma_cm channel: {e}")))?;
        let stop = Arc::new(Notify::new());
        let cm = Arc::new(CmChannel {
            channel,
            routes: Mutex::new(Vec::new()),
            requests: Mutex::new(None),
            stop: Arc::clone(&stop),
        });
        tokio::spawn(dispatch(Arc::downgrade(&cm), fd, stop));
        Ok(cm)
    }

    pub fn channel(&self) -> &Arc<EventChannel> {
        &self.channel
    }

    /// Routes the events of `id` to the returned receiver.
    pub fn watch(&self, id: &Arc<Identifier>) -> mpsc::UnboundedReceiver<CmEvent> {
        let (to, rx) = mpsc::unbounded_channel();
        let mut routes = self.routes.lock().expect("route lock");
        routes.retain(|r| r.id.strong_count() > 0 && !r.to.is_closed());
        routes.push(Route {
            id: Arc::downgrade(id),
            to,
        });
        rx
    }

    /// Routes connection requests to the returned receiver.
    pub fn listen(&self) -> mpsc::UnboundedReceiver<CmEvent> {
        let (to, rx) = mpsc::unbounded_channel();
        *self.requests.lock().expect("request lock") = Some(to);
        rx
    }

    fn route(&self, event: CmEvent, target: Option<Arc<Identifier>>) {
        if event.kind == EventType::ConnectRequest {
            if let Some(to) = &*self.requests.lock().expect("request lock") {
                let _ = to.send(event);
            }
            // No listener: dropping the new id refuses the request.
            return;
        }
        let Some(target) = target else { return };
        let routes = self.routes.lock().expect("route lock");
        if let Some(r) = routes
            .iter()
            .find(|r| r.id.upgrade().is_some_and(|id| Arc::ptr_eq(&id, &target)))
        {
            let _ = r.to.send(event);
        }
    }
}

async fn dispatch(cm: Weak<CmChannel>, fd: AsyncFd<ChannelFd<EventChannel>>, stop: Arc<Notify>) {
    loop {
        let ready = tokio::select! {
            r = fd.readable() => r,
            () = stop.notified() => return,
        };
        let Ok(mut guard) = ready else {
            return;
        };
        let Some(cm) = cm.upgrade() else { return };
        loop {
            match cm.channel.get_cm_event() {
                Ok(event) => {
                    let kind = event.event_type();
                    let status = event.status();
                    let id = event.cm_id();
                    // Acknowledge now (drop), before routing: a receiver
                    // may destroy the id at once.
                    drop(event);
                    let routed = CmEvent {
                        kind,
                        status,
                        id: id.clone(),
                    };
                    cm.route(routed, id);
                }
                Err(e) if matches!(e.0, GetEventErrorKind::NoEvent) => {
                    guard.clear_ready();
                    break;
                }
                Err(_) => return,
            }
        }
    }
}

/// Waits for the next event on `rx`, failing unless it is `want`.
pub(super) async fn expect(
    rx: &mut mpsc::UnboundedReceiver<CmEvent>,
    want: EventType,
    step: &str,
    timeout: std::time::Duration,
) -> Result<CmEvent, TransportError> {
    let event = tokio::time::timeout(timeout, rx.recv())
        .await
        .map_err(|_| TransportError::Closed(format!("{step}: timed out")))?
        .ok_or_else(|| TransportError::Closed(format!("{step}: rdma_cm channel closed")))?;
    if event.kind == want {
        Ok(event)
    } else {
        Err(event_error(step, &event))
    }
}

/// A clear error for an unexpected connection-manager event.
pub(super) fn event_error(step: &str, event: &CmEvent) -> TransportError {
    let what = match event.kind {
        EventType::Rejected => "connection rejected by the peer (nothing listening there?)",
        EventType::Unreachable => "peer unreachable",
        EventType::AddressError => "cannot resolve the address to an RDMA device",
        EventType::RouteError => "no route to the peer over RDMA",
        EventType::ConnectError => "connection error",
        EventType::Disconnected => "peer disconnected",
        EventType::DeviceRemoval => "RDMA device removed",
        _ => "unexpected event",
    };
    TransportError::Closed(format!(
        "{step}: {what} ({:?}, status {})",
        event.kind, event.status
    ))
}
