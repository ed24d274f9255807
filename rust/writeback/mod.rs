//! Write-back: `CallPlan.apply` rebuilds a traced function's results and, for `alias`, writes
//! the new contents of the caller's containers back into those very objects, all or nothing
//! (an undo log puts back what was written when a later write fails). The files, in the order
//! a call goes through them:
//!
//! - `sources.rs`: where each result comes from (`Source`, `Origin`, the call's `Outputs`);
//! - `plan.rs`: `CallPlan`, made at trace time, and `apply`, which builds the results;
//! - `kept.rs`: the subtrees the trace proved are the caller's own, which `apply` skips;
//! - `write.rs`: the writes of one call, checked (rule J31) then made all or nothing;
//! - `list.rs`, `mapping.rs`, `attributes.rs`: writing a list, a dict, an object's attributes;
//! - `slots.rs`: an attribute that is a slot, set where the instance stores it;
//! - `undo.rs`: the undo log's steps.

mod attributes;
mod kept;
mod list;
mod mapping;
mod plan;
mod slots;
mod sources;
mod undo;
mod write;

pub use plan::CallPlan;
pub use sources::{Origin, Outputs, Source};
