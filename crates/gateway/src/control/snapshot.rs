//! The local snapshot of the objects last put in force, in the state folder: written after
//! every apply (to a temporary file, synced, then renamed over the old one, so a crash leaves
//! the old or the new one whole), read when a gateway starts while etcd is unreachable.

use super::store::Entry;
use serde::{Deserialize, Serialize};
use std::io::Write as _;
use std::path::{Path, PathBuf};

const FILE: &str = "control-snapshot.json";

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Snapshot {
    /// The etcd revision the objects were applied at.
    pub revision: i64,
    pub objects: Vec<SnapshotObject>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotObject {
    pub key: String,
    pub doc: String,
    pub mod_revision: i64,
}

impl Snapshot {
    pub fn of<'a>(revision: i64, entries: impl Iterator<Item = &'a Entry>) -> Snapshot {
        Snapshot {
            revision,
            objects: entries
                .map(|e| SnapshotObject {
                    key: e.key.clone(),
                    doc: e.doc.clone(),
                    mod_revision: e.mod_revision,
                })
                .collect(),
        }
    }

    pub fn entries(self) -> Vec<Entry> {
        self.objects
            .into_iter()
            .map(|o| Entry {
                key: o.key,
                doc: o.doc,
                mod_revision: o.mod_revision,
            })
            .collect()
    }

    pub fn path(dir: &Path) -> PathBuf {
        dir.join(FILE)
    }

    /// Replaces the snapshot in `dir` (created if missing) atomically.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!("{FILE}.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(self).map_err(std::io::Error::other)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, Self::path(dir))?;
        // The rename itself is durable once the folder is synced.
        std::fs::File::open(dir)?.sync_all()
    }

    /// The snapshot in `dir`; `Ok(None)` when there is none.
    pub fn read(dir: &Path) -> Result<Option<Snapshot>, String> {
        let path = Self::path(dir);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| format!("{}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_reads_back_as_written_and_replaces_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        assert_eq!(Snapshot::read(&state).unwrap(), None);
        let e = |key: &str, rev| Entry {
            key: key.into(),
            doc: "cluster = \"app\"".into(),
            mod_revision: rev,
        };
        let first = Snapshot::of(7, [e("routes/a", 5)].iter());
        first.write(&state).unwrap();
        let second = Snapshot::of(9, [e("routes/a", 5), e("routes/b", 9)].iter());
        second.write(&state).unwrap();
        assert_eq!(Snapshot::read(&state).unwrap(), Some(second));
        assert!(!state.join(format!("{FILE}.tmp")).exists());
        std::fs::write(Snapshot::path(&state), "{").unwrap();
        assert!(Snapshot::read(&state).unwrap_err().contains(FILE));
    }
}
