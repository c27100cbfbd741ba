//! Helpers for unit tests only: a temporary directory removed on drop, under
//! the build's target directory rather than /tmp so that test files stay
//! with the checkout that made them.

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
