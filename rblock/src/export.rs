//! Exports as given on the command line (`NAME=PATH[,ro]`), and as
//! served: what clients are told, and where the data is.

use std::path::PathBuf;

use crate::backend::Source;
use crate::nbd::handshake::ExportInfo;

/// One export: what clients are told, and its storage.
#[derive(Debug)]
pub struct Export {
    pub info: ExportInfo,
    pub source: Source,
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
}

impl std::str::FromStr for ExportSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<ExportSpec, String> {
        let (name, rest) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected NAME=PATH[,ro]"))?;
        if name.is_empty() || name.len() > 256 {
            return Err(format!("{s:?}: the name must be 1 to 256 bytes"));
        }
        if name.contains('\0') {
            return Err(format!("{s:?}: the name contains NUL"));
        }
        let (path, read_only) = match rest.rsplit_once(',') {
            Some((p, "ro")) => (p, true),
            Some((p, "rw")) => (p, false),
            _ => (rest, false),
        };
        if path.is_empty() {
            return Err(format!("{s:?}: no path"));
        }
        Ok(ExportSpec {
            name: name.to_string(),
            path: PathBuf::from(path),
            read_only,
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
        for bad in ["", "=x", "name", "n="] {
            assert!(bad.parse::<ExportSpec>().is_err(), "{bad}");
        }
    }
}
