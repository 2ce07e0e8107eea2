//! The client-side tier: the installed extension in a real cluster, reached through the real
//! roles over real logins. Each test gets a fresh database.

mod content;
mod context;
mod envelopes;
mod faults;
mod immutability;
mod install;
mod isolation;
mod ledger;
mod liveness;
mod operators;
mod runs;
mod tool_calls;
