//! A host's extra DHCP options, packed into one allocation. Owns how they
//! are stored; not how a YAML value becomes the bytes (`option`) nor where
//! they go in a reply (`dhcp::reply`).

use std::{collections::BTreeMap, fmt};

/// Extra DHCP options, code -> encoded value (at most 255 bytes), kept in
/// code order as `code, length, value` runs: a fleet's hosts each carry one
/// or two short options, and a map per host would cost a tree node (some
/// 300 bytes) plus one allocation per value. Runs of up to [`INLINE`] bytes
/// (one option of 20) are kept in the host itself: a small allocation per
/// host, made while the parser's garbage is live, pins pages after that
/// garbage is freed.
#[derive(Clone, PartialEq, Eq)]
pub struct ExtraOptions(Packed);

/// Bytes of runs an [`ExtraOptions`] holds without an allocation.
pub const INLINE: usize = 22;

#[derive(Clone, PartialEq, Eq)]
enum Packed {
    Inline { len: u8, runs: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl Default for ExtraOptions {
    fn default() -> ExtraOptions {
        ExtraOptions(Packed::Inline {
            len: 0,
            runs: [0; INLINE],
        })
    }
}

impl ExtraOptions {
    fn runs(&self) -> &[u8] {
        match &self.0 {
            Packed::Inline { len, runs } => &runs[..usize::from(*len)],
            Packed::Heap(runs) => runs,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.runs().is_empty()
    }

    /// How many options there are.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// The options in code order.
    pub fn iter(&self) -> Iter<'_> {
        Iter(self.runs())
    }

    /// The value of option `code`, if the host has it.
    pub fn get(&self, code: u8) -> Option<&[u8]> {
        self.iter()
            .find(|&(c, _)| c == code)
            .map(|(_, value)| value)
    }
}

/// Values longer than 255 bytes cannot be sent and are refused by
/// validation; here they are cut to 255 so that the packing stays sound.
impl FromIterator<(u8, Vec<u8>)> for ExtraOptions {
    fn from_iter<I: IntoIterator<Item = (u8, Vec<u8>)>>(options: I) -> ExtraOptions {
        ExtraOptions::from(options.into_iter().collect::<BTreeMap<_, _>>())
    }
}

impl From<BTreeMap<u8, Vec<u8>>> for ExtraOptions {
    fn from(options: BTreeMap<u8, Vec<u8>>) -> ExtraOptions {
        let mut packed =
            Vec::with_capacity(options.values().map(|value| 2 + value.len().min(255)).sum());
        for (code, value) in &options {
            let value = &value[..value.len().min(255)];
            packed.push(*code);
            packed.push(u8::try_from(value.len()).unwrap_or(u8::MAX));
            packed.extend_from_slice(value);
        }
        if let Ok(len) = u8::try_from(packed.len())
            && packed.len() <= INLINE
        {
            let mut runs = [0; INLINE];
            runs[..packed.len()].copy_from_slice(&packed);
            return ExtraOptions(Packed::Inline { len, runs });
        }
        ExtraOptions(Packed::Heap(packed.into_boxed_slice()))
    }
}

/// As the map it stands for: `{224: [1, 2]}`.
impl fmt::Debug for ExtraOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &'a ExtraOptions {
    type Item = (u8, &'a [u8]);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// The options of an [`ExtraOptions`], in code order.
pub struct Iter<'a>(&'a [u8]);

impl<'a> Iterator for Iter<'a> {
    type Item = (u8, &'a [u8]);

    fn next(&mut self) -> Option<(u8, &'a [u8])> {
        let (&[code, len], rest) = self.0.split_first_chunk::<2>()?;
        let (value, rest) = rest.split_at(usize::from(len));
        self.0 = rest;
        Some((code, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_come_back_in_code_order_with_their_values() {
        let options = ExtraOptions::from(BTreeMap::from([
            (224, b"node-1".to_vec()),
            (42, vec![10, 66, 0, 1]),
            (80, Vec::new()),
        ]));
        let back: Vec<_> = options.iter().collect();
        assert_eq!(
            back,
            [
                (42, &[10, 66, 0, 1][..]),
                (80, &[][..]),
                (224, &b"node-1"[..])
            ]
        );
        assert_eq!(options.len(), 3);
        assert_eq!(options.get(224), Some(&b"node-1"[..]));
        assert_eq!(options.get(43), None);
        assert_eq!(
            format!("{options:?}"),
            "{42: [10, 66, 0, 1], 80: [], 224: [110, 111, 100, 101, 45, 49]}"
        );
    }

    #[test]
    fn no_options_allocate_nothing_and_equal_the_default() {
        let none = ExtraOptions::from(BTreeMap::new());
        assert!(none.is_empty() && none == ExtraOptions::default());
        assert_eq!(none.iter().count(), 0);
    }

    #[test]
    fn a_255_byte_value_fits_its_length_octet() {
        let options: ExtraOptions = [(224, vec![7; 255])].into_iter().collect();
        assert_eq!(options.get(224).map(<[u8]>::len), Some(255));
    }

    #[test]
    fn short_and_long_options_read_the_same_inline_or_not() {
        let short = BTreeMap::from([(224, vec![1; INLINE - 2])]);
        let long = BTreeMap::from([(224, vec![1; INLINE - 1])]);
        for map in [short, long] {
            let options = ExtraOptions::from(map.clone());
            let back: BTreeMap<u8, Vec<u8>> =
                options.iter().map(|(c, v)| (c, v.to_vec())).collect();
            assert_eq!(back, map);
        }
        assert!(matches!(
            ExtraOptions::from(BTreeMap::from([(224, vec![1; INLINE - 2])])).0,
            Packed::Inline { .. }
        ));
        assert!(matches!(
            ExtraOptions::from(BTreeMap::from([(224, vec![1; INLINE - 1])])).0,
            Packed::Heap(_)
        ));
    }
}
