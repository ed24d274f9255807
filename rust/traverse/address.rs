//! Maps keyed by object addresses (or by hashes already mixed from them).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Addresses are unique while their objects live and 16-byte aligned, so dropping the low bits
/// and one multiply spread them well, much cheaper than SipHash.
#[derive(Default)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only addresses are hashed")
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (n >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

pub type AddressMap<K, V> = HashMap<K, V, BuildHasherDefault<AddressHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_hash_spreads_aligned_pointers() {
        let hash = |n: usize| {
            let mut h = AddressHasher::default();
            h.write_usize(n);
            h.finish()
        };
        let hashes: std::collections::HashSet<u64> = (0..1000)
            .map(|i| hash(0x7f00_0000 + 16 * i) >> 54)
            .collect();
        assert!(
            hashes.len() > 500,
            "top bits too clustered: {}",
            hashes.len()
        );
    }
}
