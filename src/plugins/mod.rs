//! The plugin host (seed 000, issue 4).
//!
//! - [`text`]: the character classes of the page and the cleaning of plugin
//!   text before a client sees it.
//! - [`wire`]: the four message shapes, the host's error object, and every
//!   line the host writes.
//! - [`calls`]: the typed params of every call a plugin makes, and their
//!   results (API 1.0 and the 1.1 additions).
//! - [`manifest`]: `omniconflux-plugin.json`, the folder checks and the
//!   snapshot hash (the only file here that reads the filesystem).

pub mod calls;
pub mod manifest;
pub mod text;
pub mod wire;
