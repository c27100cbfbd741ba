//! Agent transports (issue 3).
