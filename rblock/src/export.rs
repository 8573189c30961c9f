//! Exports as given on the command line
//! (`NAME=PATH[,ro][,secret-file=FILE]`), and as served: what clients are
//! told, where the data is, and the secret a fabric client must prove for
//! it.

use std::path::PathBuf;
use std::sync::Arc;

use crate::backend::Source;
use crate::nbd::handshake::ExportInfo;

/// One export: what clients are told, and its storage.
#[derive(Debug)]
pub struct Export {
    pub info: ExportInfo,
    pub source: Source,
    /// The secret `rblock connect` must prove to open this export over the
    /// fabric (None: the server's `--secret-file`, if any).
    pub secret: Option<Arc<Vec<u8>>>,
}

impl AsRef<ExportInfo> for Export {
    fn as_ref(&self) -> &ExportInfo {
        &self.info
    }
}

/// One `--export` argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSpec {
    pub name: String,
    pub path: PathBuf,
    pub read_only: bool,
    /// `secret-file=FILE`: this export's own fabric secret.
    pub secret_file: Option<PathBuf>,
}

impl std::str::FromStr for ExportSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<ExportSpec, String> {
        let (name, rest) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected NAME=PATH[,ro][,secret-file=FILE]"))?;
        if name.is_empty() || name.len() > 256 {
            return Err(format!("{s:?}: the name must be 1 to 256 bytes"));
        }
        if name.contains('\0') {
            return Err(format!("{s:?}: the name contains NUL"));
        }
        // Options come after the path, each after a comma; a comma
        // followed by anything else belongs to the path.
        let (mut path, mut read_only, mut secret_file) = (rest, false, None);
        loop {
            match path.rsplit_once(',') {
                Some((_, "ro")) => read_only = true,
                Some((_, "rw")) => {}
                Some((_, opt)) if opt.starts_with("secret-file=") => {
                    let f = &opt["secret-file=".len()..];
                    if f.is_empty() {
                        return Err(format!("{s:?}: secret-file= names no file"));
                    }
                    secret_file = Some(PathBuf::from(f));
                }
                _ => break,
            }
            path = path.rsplit_once(',').expect("matched above").0;
        }
        if path.is_empty() {
            return Err(format!("{s:?}: no path"));
        }
        Ok(ExportSpec {
            name: name.to_string(),
            path: PathBuf::from(path),
            read_only,
            secret_file,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_arguments_parse() {
        let e: ExportSpec = "disk=/srv/a.img,ro".parse().unwrap();
        assert_eq!(e.name, "disk");
        assert_eq!(e.path, PathBuf::from("/srv/a.img"));
        assert!(e.read_only);
        let e: ExportSpec = "d=/x,y".parse().unwrap();
        assert_eq!(e.path, PathBuf::from("/x,y"));
        assert!(!e.read_only);
        assert_eq!(e.secret_file, None);
        let e: ExportSpec = "vm=/srv/vm.img,secret-file=/etc/rblock/vm,ro"
            .parse()
            .unwrap();
        assert_eq!(e.path, PathBuf::from("/srv/vm.img"));
        assert!(e.read_only);
        assert_eq!(e.secret_file, Some(PathBuf::from("/etc/rblock/vm")));
        let e: ExportSpec = "vm=/a,b,rw,secret-file=k".parse().unwrap();
        assert_eq!(e.path, PathBuf::from("/a,b"));
        assert!(!e.read_only);
        for bad in ["", "=x", "name", "n=", "n=/x,secret-file="] {
            assert!(bad.parse::<ExportSpec>().is_err(), "{bad}");
        }
    }
}
