//! Loading an inventory from a file on disk. Owns reading the file and
//! attaching its path to errors; not watching it for changes or deciding
//! what to do with a refused reload (the caller keeps serving the previous
//! inventory).

use std::{fs, path::Path};

use super::{Inventory, LoadError, oob, patch};

/// A file's inventory, with what its next reload patches from.
#[derive(Debug)]
pub struct Loaded {
    pub inventory: Inventory,
    /// Where the file's host entries are; `None` when the file cannot be
    /// cut into them (the next reload parses it whole).
    pub layout: Option<patch::Layout>,
    /// Whether only the host entries that changed were parsed.
    pub patched: bool,
}

fn read(path: &Path) -> Result<String, LoadError> {
    fs::read_to_string(path).map_err(|source| LoadError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Reads `path` and hands the text to [`Inventory::parse`].
pub(super) fn load(path: &Path) -> Result<Inventory, LoadError> {
    Inventory::parse(path, &read(path)?)
}

/// Reads `path` again. With `previous`, the inventory loaded from the
/// file's last text and that text's layout, only the host entries that
/// changed are parsed when the rest of the file is the same; otherwise,
/// or when the patch cannot vouch for its result, the whole file is.
pub(super) fn reload(
    path: &Path,
    previous: Option<(&Inventory, &patch::Layout)>,
) -> Result<Loaded, LoadError> {
    let text = read(path)?;
    if let Some((inventory, layout)) = previous
        && let Some((inventory, layout)) =
            patch::patch(path, &text, inventory, layout, &oob::System)
    {
        return Ok(Loaded {
            inventory,
            layout: Some(layout),
            patched: true,
        });
    }
    Ok(Loaded {
        inventory: Inventory::parse(path, &text)?,
        layout: patch::layout(&text),
        patched: false,
    })
}

#[cfg(test)]
mod tests {
    use std::{fs, path::PathBuf, process};

    use super::*;

    /// A file in the temp dir, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, contents: &str) -> TempFile {
            let path =
                std::env::temp_dir().join(format!("pxe-agent-inventory-{}-{name}", process::id()));
            fs::write(&path, contents).expect("write temp inventory");
            TempFile(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = fs::remove_file(&self.0);
        }
    }

    #[test]
    fn loads_a_valid_file() {
        let file = TempFile::new(
            "valid.yaml",
            "subnets: [{cidr: 10.66.0.0/16}]\nprofiles: [{name: bare}]\n\
             hosts: [{mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: bare}]\n",
        );
        let inventory = Inventory::load(&file.0).expect("valid");
        assert_eq!(inventory.hosts.len(), 1);
    }

    #[test]
    fn missing_file_is_an_io_error_naming_the_path() {
        let path = Path::new("/nonexistent/pxe-agent/inventory.yaml");
        let err = Inventory::load(path).expect_err("missing");
        assert!(
            matches!(&err, LoadError::Io { path: p, .. } if p == path),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with("failed to read inventory /nonexistent/pxe-agent/inventory.yaml: "),
            "{err}"
        );
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn invalid_file_error_names_the_path() {
        let file = TempFile::new(
            "invalid.yaml",
            "subnets: []\nprofiles: []\nhosts: [{mac: 52:54:00:12:34:56, ip: 10.66.1.10, profile: x}]\n",
        );
        let err = Inventory::load(&file.0).expect_err("invalid");
        let LoadError::Invalid { path, problems } = &err else {
            panic!("expected invalid, got {err:?}")
        };
        assert_eq!(path, &file.0);
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(
            err.to_string().contains(&file.0.display().to_string()),
            "{err}"
        );
    }
}
