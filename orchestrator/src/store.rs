//! The orchestrator node's durable state, in one redb file (`<data-dir>/raft.redb`): the raft
//! log, the vote, the committed log id, and the state machine (the applied [`Views`] with its
//! last applied log id and membership) and its latest snapshot.
//!
//! Every write is a redb transaction committed with immediate durability (fsync) before openraft
//! is told it happened: a node killed at any moment restarts from what it acknowledged. Values
//! are postcard-encoded.
//!
//! The state machine is written whole after each applied batch (the view manager's state is a
//! few kilobytes); a snapshot is that same encoding with its metadata.

use crate::consensus::{
    Entry, LogId, Member, NodeId, Reply, Snapshot, SnapshotMeta, StorageError, StoredMembership,
    TypeConfig, Vote,
};
use crate::views::Views;
use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    EntryPayload, LogState, RaftLogId, RaftLogReader, RaftSnapshotBuilder, StorageIOError,
};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tokio::sync::watch;

/// Log entries by index.
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// Everything else, by name (the `KEY_*` constants).
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_PURGED: &str = "purged";
const KEY_SM: &str = "state_machine";
const KEY_SNAPSHOT: &str = "snapshot";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("creating the data directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("opening the orchestrator's store {path}: {source}")]
    Open {
        path: PathBuf,
        source: redb::DatabaseError,
    },
    #[error("the orchestrator's store: {0}")]
    Db(#[from] redb::Error),
    #[error("the orchestrator's store holds an undecodable {what}: {source}")]
    Decode {
        what: &'static str,
        source: postcard::Error,
    },
    #[error("encoding {what}: {source}")]
    Encode {
        what: &'static str,
        source: postcard::Error,
    },
}

fn db_err(e: impl Into<redb::Error>) -> StoreError {
    StoreError::Db(e.into())
}

/// The state machine's state: the view manager and what raft needs to know of it.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Applied {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub views: Views,
}

/// What the node's services read: the applied state and a version bumped after every change
/// (sessions push assignments when it moves).
pub struct Shared {
    state: RwLock<Applied>,
    pub version: watch::Sender<u64>,
}

impl Shared {
    /// A read-only look at the applied state.
    pub fn read<T>(&self, f: impl FnOnce(&Applied) -> T) -> T {
        // Writers replace whole values: a poisoned lock still holds a consistent state.
        f(&self.state.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn write<T>(&self, f: impl FnOnce(&mut Applied) -> T) -> T {
        let r = f(&mut self.state.write().unwrap_or_else(|e| e.into_inner()));
        self.version.send_modify(|v| *v += 1);
        r
    }
}

/// Opens (or creates) the store in `dir`: the log half and the state machine half, sharing one
/// database, and the state both halves' readers see.
pub fn open(dir: &Path) -> Result<(LogStore, StateMachine, Arc<Shared>), StoreError> {
    std::fs::create_dir_all(dir).map_err(|source| StoreError::Dir {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join("raft.redb");
    let db = Database::create(&path).map_err(|source| StoreError::Open {
        path: path.clone(),
        source,
    })?;
    {
        // Both tables exist from the start, so reads never meet a missing table.
        let tx = db.begin_write().map_err(db_err)?;
        tx.open_table(LOG).map_err(db_err)?;
        tx.open_table(META).map_err(db_err)?;
        tx.commit().map_err(db_err)?;
    }
    let db = Arc::new(db);
    let applied: Applied = get_meta(&db, KEY_SM, "state machine")?.unwrap_or_default();
    let (version, _) = watch::channel(0);
    let shared = Arc::new(Shared {
        state: RwLock::new(applied),
        version,
    });
    Ok((
        LogStore { db: db.clone() },
        StateMachine {
            db,
            shared: shared.clone(),
            snapshots: Arc::new(AtomicU64::new(0)),
        },
        shared,
    ))
}

/// Whether `dir` holds a store that was ever written to (a node restarted from it rejoins its
/// cluster instead of initializing one).
pub fn exists(dir: &Path) -> bool {
    dir.join("raft.redb").exists()
}

fn get_meta<T: serde::de::DeserializeOwned>(
    db: &Database,
    key: &str,
    what: &'static str,
) -> Result<Option<T>, StoreError> {
    let tx = db.begin_read().map_err(db_err)?;
    let t = tx.open_table(META).map_err(db_err)?;
    let Some(v) = t.get(key).map_err(db_err)? else {
        return Ok(None);
    };
    postcard::from_bytes(v.value())
        .map(Some)
        .map_err(|source| StoreError::Decode { what, source })
}

fn encode<T: serde::Serialize>(v: &T, what: &'static str) -> Result<Vec<u8>, StoreError> {
    postcard::to_allocvec(v).map_err(|source| StoreError::Encode { what, source })
}

/// Writes `(key, value)` pairs of the meta table in one durable transaction.
fn put_meta(db: &Database, pairs: &[(&str, &[u8])]) -> Result<(), StoreError> {
    let tx = db.begin_write().map_err(db_err)?;
    {
        let mut t = tx.open_table(META).map_err(db_err)?;
        for (k, v) in pairs {
            t.insert(*k, *v).map_err(db_err)?;
        }
    }
    tx.commit().map_err(db_err)
}

/// The log half: entries, vote, committed and purged log ids.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry>, StoreError> {
        let tx = self.db.begin_read().map_err(db_err)?;
        let t = tx.open_table(LOG).map_err(db_err)?;
        let mut out = Vec::new();
        for item in t.range(range).map_err(db_err)? {
            let (_, v) = item.map_err(db_err)?;
            out.push(
                postcard::from_bytes(v.value()).map_err(|source| StoreError::Decode {
                    what: "log entry",
                    source,
                })?,
            );
        }
        Ok(out)
    }

    fn last_entry(&self) -> Result<Option<Entry>, StoreError> {
        let tx = self.db.begin_read().map_err(db_err)?;
        let t = tx.open_table(LOG).map_err(db_err)?;
        let Some((_, v)) = t.last().map_err(db_err)? else {
            return Ok(None);
        };
        postcard::from_bytes(v.value())
            .map(Some)
            .map_err(|source| StoreError::Decode {
                what: "log entry",
                source,
            })
    }

    /// Removes the entries of `range`.
    fn remove(&self, range: impl RangeBounds<u64>) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(db_err)?;
        {
            let mut t = tx.open_table(LOG).map_err(db_err)?;
            t.retain_in(range, |_, _| false).map_err(db_err)?;
        }
        tx.commit().map_err(db_err)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.entries(range)
            .map_err(|e| StorageIOError::read_logs(&e).into())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let r = (|| {
            let purged: Option<LogId> = get_meta(&self.db, KEY_PURGED, "purged log id")?;
            let last = self.last_entry()?.map(|e| *e.get_log_id()).or(purged);
            Ok::<_, StoreError>(LogState {
                last_purged_log_id: purged,
                last_log_id: last,
            })
        })();
        r.map_err(|e| StorageIOError::read_logs(&e).into())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        encode(vote, "vote")
            .and_then(|v| put_meta(&self.db, &[(KEY_VOTE, &v)]))
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        get_meta(&self.db, KEY_VOTE, "vote").map_err(|e| StorageIOError::read_vote(&e).into())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        encode(&committed, "committed log id")
            .and_then(|v| put_meta(&self.db, &[(KEY_COMMITTED, &v)]))
            .map_err(|e| StorageIOError::write(&e).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        get_meta::<Option<LogId>>(&self.db, KEY_COMMITTED, "committed log id")
            .map(Option::flatten)
            .map_err(|e| StorageIOError::read(&e).into())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let r = (|| {
            let tx = self.db.begin_write().map_err(db_err)?;
            {
                let mut t = tx.open_table(LOG).map_err(db_err)?;
                for e in entries {
                    let v = encode(&e, "log entry")?;
                    t.insert(e.get_log_id().index, v.as_slice())
                        .map_err(db_err)?;
                }
            }
            tx.commit().map_err(db_err)
        })();
        match r {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(StorageIOError::write_logs(&e).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.remove(log_id.index..)
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // The purged id first: a crash in between leaves entries that are ignored, never a
        // log whose start is unknown.
        encode(&log_id, "purged log id")
            .and_then(|v| put_meta(&self.db, &[(KEY_PURGED, &v)]))
            .and_then(|()| self.remove(..=log_id.index))
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }
}

/// The state machine half: the view manager, applied.
#[derive(Clone)]
pub struct StateMachine {
    db: Arc<Database>,
    shared: Arc<Shared>,
    /// Snapshots built by this process (part of the snapshot id).
    snapshots: Arc<AtomicU64>,
}

/// A snapshot as stored: its metadata and the encoded [`Applied`].
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

impl StateMachine {
    fn persist(&self) -> Result<(), StoreError> {
        let v = self.shared.read(|a| encode(a, "state machine"))?;
        put_meta(&self.db, &[(KEY_SM, &v)])
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let r = (|| {
            let (data, last_applied, membership) = self.shared.read(|a| {
                encode(a, "state machine").map(|d| (d, a.last_applied, a.membership.clone()))
            })?;
            let n = self.snapshots.fetch_add(1, Ordering::Relaxed);
            let snapshot_id = match last_applied {
                Some(l) => format!("{}-{}-{n}", l.leader_id, l.index),
                None => format!("none-{n}"),
            };
            let meta = SnapshotMeta {
                last_log_id: last_applied,
                last_membership: membership,
                snapshot_id,
            };
            let stored = StoredSnapshot { meta, data };
            tracing::info!(meta = %stored.meta, bytes = stored.data.len(), "snapshot built");
            put_meta(&self.db, &[(KEY_SNAPSHOT, &encode(&stored, "snapshot")?)])?;
            Ok::<_, StoreError>(Snapshot {
                meta: stored.meta,
                snapshot: Box::new(Cursor::new(stored.data)),
            })
        })();
        r.map_err(|e| StorageIOError::write_snapshot(None, &e).into())
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok(self.shared.read(|a| (a.last_applied, a.membership.clone())))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Reply>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut replies = Vec::new();
        let mut last = None;
        self.shared.write(|a| {
            for e in entries {
                let id = *e.get_log_id();
                a.last_applied = Some(id);
                last = Some(id);
                replies.push(match &e.payload {
                    EntryPayload::Blank => Ok(()),
                    EntryPayload::Normal(cmd) => a.views.apply(cmd).map_err(|e| e.to_string()),
                    EntryPayload::Membership(m) => {
                        a.membership = StoredMembership::new(Some(id), m.clone());
                        Ok(())
                    }
                });
            }
        });
        if let Some(id) = last {
            self.persist().map_err(|e| StorageIOError::apply(id, &e))?;
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let r = (|| {
            let mut applied: Applied =
                postcard::from_bytes(&data).map_err(|source| StoreError::Decode {
                    what: "snapshot",
                    source,
                })?;
            applied.last_applied = meta.last_log_id;
            applied.membership = meta.last_membership.clone();
            let stored = StoredSnapshot {
                meta: meta.clone(),
                data,
            };
            let sm = encode(&applied, "state machine")?;
            let snap = encode(&stored, "snapshot")?;
            put_meta(&self.db, &[(KEY_SM, &sm), (KEY_SNAPSHOT, &snap)])?;
            self.shared.write(|a| *a = applied);
            tracing::info!(%meta, "snapshot installed");
            Ok::<_, StoreError>(())
        })();
        r.map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e).into())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        get_meta::<StoredSnapshot>(&self.db, KEY_SNAPSHOT, "snapshot")
            .map(|s| {
                s.map(|s| Snapshot {
                    meta: s.meta,
                    snapshot: Box::new(Cursor::new(s.data)),
                })
            })
            .map_err(|e| StorageIOError::read_snapshot(None, &e).into())
    }
}

/// The members of the last applied membership, by id.
pub fn members(a: &Applied) -> Vec<(NodeId, Member)> {
    a.membership
        .membership()
        .nodes()
        .map(|(id, m)| (*id, m.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::Command;
    use openraft::testing::{StoreBuilder, Suite};

    /// A fresh store in its own directory under the system's temp dir, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static N: AtomicU64 = AtomicU64::new(0);
            let d = std::env::temp_dir().join(format!(
                "tardi-raft-store-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&d);
            TempDir(d)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for Builder {
        async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
            let d = TempDir::new();
            let (log, sm, _) = open(&d.0).expect("open store");
            Ok((d, log, sm))
        }
    }

    /// openraft's storage suite: log append/read/truncate/purge, vote, committed, membership
    /// from log and state machine, apply, snapshot building and transfer.
    #[test]
    fn openraft_storage_suite() {
        Suite::test_all(Builder).expect("storage suite");
    }

    fn log_id(term: u64, index: u64) -> LogId {
        openraft::LogId::new(openraft::CommittedLeaderId::new(term, 1), index)
    }

    fn register(term: u64, index: u64, m: &str) -> Entry {
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Normal(Command::Register {
                machine: m.into(),
                api: format!("{m}:7701"),
            }),
        }
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// What a node wrote is what it reads after a restart: vote, log (after a truncation and a
    /// purge), and the applied views; and a snapshot installed elsewhere reproduces them.
    #[test]
    fn state_survives_a_restart_and_snapshots_round_trip() {
        let d = TempDir::new();
        run(async {
            let (mut log, mut sm, _) = open(&d.0).unwrap();
            let vote = Vote::new(3, 7);
            log.save_vote(&vote).await.unwrap();
            let entries: Vec<Entry> = (1..=6).map(|i| register(3, i, &format!("m{i}"))).collect();
            // Writing through the raft callback needs a raft; write the entries directly.
            let tx = log.db.begin_write().unwrap();
            {
                let mut t = tx.open_table(LOG).unwrap();
                for e in &entries {
                    t.insert(e.log_id.index, postcard::to_allocvec(e).unwrap().as_slice())
                        .unwrap();
                }
            }
            tx.commit().unwrap();
            log.truncate(log_id(3, 5)).await.unwrap();
            log.purge(log_id(3, 2)).await.unwrap();
            let replies = sm.apply(entries[..4].to_vec()).await.unwrap();
            assert_eq!(replies, vec![Ok(()); 4]);
            let bad = sm
                .apply([Entry {
                    log_id: log_id(3, 5),
                    payload: EntryPayload::Normal(Command::Activate {
                        service: "nope".into(),
                        view: 1,
                        primary: "m1".into(),
                        now_ms: 0,
                    }),
                }])
                .await
                .unwrap();
            assert!(bad[0].is_err(), "a refused command is answered, not fatal");
        });
        let snap = run(async {
            let (mut log, mut sm, shared) = open(&d.0).unwrap();
            assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(3, 7)));
            let st = log.get_log_state().await.unwrap();
            assert_eq!(st.last_purged_log_id, Some(log_id(3, 2)));
            assert_eq!(st.last_log_id, Some(log_id(3, 4)));
            let got: Vec<u64> = log
                .try_get_log_entries(0..100)
                .await
                .unwrap()
                .iter()
                .map(|e| e.log_id.index)
                .collect();
            assert_eq!(got, vec![3, 4]);
            assert_eq!(
                sm.applied_state().await.unwrap().0,
                Some(log_id(3, 5)),
                "the applied state was persisted"
            );
            assert_eq!(shared.read(|a| a.views.machines.len()), 4);
            let mut b = sm.get_snapshot_builder().await;
            let s = b.build_snapshot().await.unwrap();
            let again = sm.get_current_snapshot().await.unwrap().unwrap();
            assert_eq!(again.meta, s.meta);
            s
        });
        let other = TempDir::new();
        run(async {
            let (_, mut sm, shared) = open(&other.0).unwrap();
            sm.install_snapshot(&snap.meta, snap.snapshot)
                .await
                .unwrap();
            assert_eq!(shared.read(|a| a.views.machines.len()), 4);
            assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(3, 5)));
        });
        run(async {
            let (_, mut sm, shared) = open(&other.0).unwrap();
            assert_eq!(shared.read(|a| a.views.machines.len()), 4);
            assert!(sm.get_current_snapshot().await.unwrap().is_some());
        });
    }
}
