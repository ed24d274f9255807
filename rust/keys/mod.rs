//! The lowest layer's helpers, keyed by object identity (they use nothing else of the crate):
//!
//! - `address.rs`: maps keyed by object addresses, and the bounded per-thread caches built on
//!   them (key orders, nnx memos, the identity maps of the alias/strict flatten);
//! - `order.rs`: a dict's children in JAX's order (sorted keys), with the per-thread cache of
//!   the sorted order of exact-str keys.

pub mod address;
pub mod order;
