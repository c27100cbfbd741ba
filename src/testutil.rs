//! Helpers for unit tests only: a temporary directory removed on drop, under
//! the build's target directory rather than /tmp so that test files stay
//! with the checkout that made them, and the fuzz checks' generator.

use std::path::{Path, PathBuf};

pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/unit-tmp");
        let p = base.join(format!("{tag}-{}", crate::ids::secret_hex(6)));
        std::fs::create_dir_all(&p).expect("create unit test dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// xorshift64*: a deterministic generator for the fuzz checks, so that a
/// failure names its iteration.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
        &from[self.below(from.len())]
    }
}
