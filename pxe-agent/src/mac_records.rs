//! Reading a redb table of JSON records keyed by MAC, the on-disk form the
//! recovery and netboot stores share: every entry parsed, or the first one
//! that does not parse, named by its key. Each store keeps its own table,
//! record type and errors.

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;

use crate::mac::MacAddr;

/// MAC (lowercase colon form) -> JSON record.
pub type Table = TableDefinition<'static, &'static str, &'static [u8]>;

#[derive(Debug)]
pub enum ReadError {
    Db(redb::Error),
    /// An entry whose key is no MAC or whose value is no record.
    Corrupt {
        key: String,
        message: String,
    },
}

/// Every record in `table`, by MAC, in key order.
pub fn read_all<R: DeserializeOwned>(
    db: &Database,
    table: Table,
) -> Result<Vec<(MacAddr, R)>, ReadError> {
    let db_error = |e: redb::Error| ReadError::Db(e);
    let txn = db.begin_read().map_err(|e| db_error(e.into()))?;
    let table = txn.open_table(table).map_err(|e| db_error(e.into()))?;
    let mut out = Vec::new();
    for entry in table.iter().map_err(|e| db_error(e.into()))? {
        let (key, value) = entry.map_err(|e| db_error(e.into()))?;
        let corrupt = |message: String| ReadError::Corrupt {
            key: key.value().to_owned(),
            message,
        };
        let mac = key
            .value()
            .parse::<MacAddr>()
            .map_err(|e| corrupt(e.to_string()))?;
        let record = serde_json::from_slice(value.value()).map_err(|e| corrupt(e.to_string()))?;
        out.push((mac, record));
    }
    Ok(out)
}
