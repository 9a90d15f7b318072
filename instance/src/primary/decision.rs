//! What a primary may release: an epoch is decided once every backup it waits for (the
//! *required* ones) acknowledged it; who is required as views change.

#[allow(unused_imports)]
use super::*;

/// What the primary decided and what it waits for.
#[derive(Debug, Default)]
pub(crate) struct Decision {
    /// The last epoch produced (the full checkpoint at start is epoch 0).
    pub(super) produced: Option<u64>,
    /// The last epoch released (decided).
    pub(super) decided: Option<u64>,
    /// Last acknowledged epoch per backup (of this run).
    pub(super) acked: BTreeMap<String, u64>,
    /// Backups whose acknowledgement every decision waits for.
    pub(super) required: BTreeSet<String>,
    /// The epoch of the full checkpoint each backup was sent in this run: it has joined once
    /// it acknowledged that epoch.
    pub(super) full_at: BTreeMap<String, u64>,
    /// A fresh deploy that wants backups: nothing is decided (released) before one has joined.
    /// Otherwise a primary that died before its first backup held the service would have let
    /// replies out of a state no machine keeps (the service would restart from nothing).
    /// Cleared once a backup joined; a view with no backups at all releases alone (the pause
    /// hook), whatever this says.
    pub(super) unprotected: bool,
}

impl Decision {
    /// The newest epoch every required backup holds (all of them, with none required).
    pub(super) fn decidable(&self) -> Option<u64> {
        let produced = self.produced?;
        if self.unprotected {
            return None;
        }
        self.required
            .iter()
            .map(|b| self.acked.get(b).copied())
            .try_fold(produced, |m, a| a.map(|a| m.min(a)))
    }

    /// Backups that joined (acknowledged their full checkpoint) become required: decisions
    /// wait for them from then on, so they catch up with the decided epoch (which
    /// [`Decision::holds_decided`] tells; the view is activated only then).
    ///
    /// (Waiting for a joiner to catch up *before* requiring it never ends when its
    /// acknowledgements take longer than an epoch: with no backup required, every produced
    /// epoch is decided at once, so the decided epoch stays ahead of each acknowledgement.)
    pub(super) fn promote_joined(&mut self) {
        for (b, &f) in &self.full_at {
            if !self.required.contains(b) && self.acked.get(b).is_some_and(|&a| a >= f) {
                self.required.insert(b.clone());
                self.unprotected = false;
            }
        }
    }

    /// Whether `b` is required and holds every decided epoch: it could take over without
    /// losing released output.
    pub(super) fn holds_decided(&self, b: &str) -> bool {
        self.required.contains(b)
            && self
                .decided
                .is_none_or(|d| self.acked.get(b).is_some_and(|&a| a >= d))
    }

    /// `b` lost its stream: it must join again with a full checkpoint. It stays required if it
    /// was: only a new view may stop decisions from waiting for a backup. (Otherwise a primary
    /// whose backups all refuse it — because they moved on to a newer view — would find no one
    /// to wait for and release everything by itself.)
    pub(super) fn detach(&mut self, b: &str) {
        self.full_at.remove(b);
        self.acked.remove(b);
    }

    /// `b` left the view and its stream ended: forgotten if that view is `active`; otherwise
    /// it stays required with what it acknowledged (see [`Decision::view_changed`]).
    pub(super) fn detach_kept(&mut self, b: &str, active: bool) {
        if active {
            self.forget(b);
        } else {
            self.full_at.remove(b);
        }
    }

    /// `b` is no longer a backup of the view.
    pub(super) fn forget(&mut self, b: &str) {
        self.detach(b);
        self.required.remove(b);
    }

    /// The view's backups are now `backups`; `active`: the orchestrator has activated it.
    ///
    /// A backup the view leaves out is forgotten only once that view is active. Until then a
    /// failover still picks its candidates from the last active view, which holds it: had the
    /// primary stopped waiting for it on a proposal, it could release output on the other
    /// backups' acknowledgements alone, lose those backups with its own machine, and leave the
    /// dropped backup to take over from an image older than what a client saw. So decisions
    /// keep waiting for it (its stream stops with the proposal: they wait for the activation,
    /// one round trip to the orchestrator, since the view's own backups already hold them).
    pub(super) fn view_changed<'a>(
        &mut self,
        backups: impl IntoIterator<Item = &'a String>,
        active: bool,
    ) {
        if !active {
            return;
        }
        let now: BTreeSet<&String> = backups.into_iter().collect();
        let gone: Vec<String> = self
            .full_at
            .keys()
            .chain(self.required.iter())
            .filter(|b| !now.contains(b))
            .cloned()
            .collect();
        for b in gone {
            self.forget(&b);
        }
    }
}
