//! The plugin host (seed 000, issue 4).
