//! Parsing a large inventory file a slice of its host list at a time: the
//! YAML parser holds every event of the text it is given until the value is
//! built, some kilobytes a host, so the file's frame (everything but the
//! host entries) is parsed first and then the entries in batches, each
//! checked and dropped before the next is parsed (`validate`'s
//! `validate_in_batches`).
//!
//! Owns the batches; the cut into entries is `patch`'s. The result is the
//! one a whole parse gives, problems and their order included; a text the
//! cut cannot vouch for, or one a batch or the frame does not parse, is
//! left to the whole parse, whose syntax messages name the file's own
//! lines.

use std::path::{Path, PathBuf};

use super::{Inventory, LoadError, oob, patch, raw::RawHost, raw::RawInventory, validate};

/// Host entries parsed at a time: the parser's events for this many hosts
/// are some megabytes.
pub(super) const BATCH: usize = 1024;

/// `text` parsed and validated in batches of host entries, or `None` when
/// the whole parse is the one to make (see the module's comment).
pub(super) fn parse(
    path: &Path,
    text: &str,
    secrets: &dyn oob::SecretSource,
) -> Option<Result<Inventory, LoadError>> {
    let cut = patch::cut(text)?;
    let frame: RawInventory = serde_norway::from_str(&cut.with_entries(&[])).ok()?;
    let batches = cut.entries.chunks(BATCH).map(|entries| {
        let (start, end) = (
            entries.first().map_or(0, |e| e.0),
            entries.last().map_or(0, |e| e.1),
        );
        serde_norway::from_str::<Vec<RawHost>>(&text[start..end])
            .ok()
            // Each entry is one host: anything else is not what was cut.
            .filter(|hosts| hosts.len() == entries.len())
            .ok_or(())
    });
    let mut secrets = oob::Secrets::new(secrets, path);
    let checked =
        validate::validate_in_batches(&frame, batches, cut.entries.len(), &mut secrets).ok()?;
    Some(
        checked
            .map(|mut inventory| {
                inventory.reindex();
                inventory
            })
            .map_err(|problems| LoadError::Invalid {
                path: PathBuf::from(path),
                problems,
            }),
    )
}
