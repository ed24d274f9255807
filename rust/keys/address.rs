//! Maps keyed by object addresses (or by hashes already mixed from them).

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

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

/// Insert into a per-thread cache, emptied first when it holds `max` entries. The old entries
/// are dropped after the borrow ends: a decref may run a finalizer, which may use the cache
/// again. Nothing is inserted while the cache is borrowed (a finalizer's own use of it).
pub fn insert_bounded<K: Eq + Hash, V>(
    cache: &RefCell<AddressMap<K, V>>,
    key: K,
    value: V,
    max: usize,
) {
    let evicted = cache.try_borrow_mut().ok().map(|mut cache| {
        let evicted = if cache.len() >= max {
            std::mem::take(&mut *cache)
        } else {
            AddressMap::default()
        };
        // An entry replaced under the same key goes after the borrow too.
        let replaced = cache.insert(key, value);
        (evicted, replaced)
    });
    drop(evicted);
}

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
