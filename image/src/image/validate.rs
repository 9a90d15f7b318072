//! [`ProcessImage::validate`]: the internal consistency of a checkpoint's metadata, checked
//! before anything else looks at it (every index, length, offset and range inside what it
//! refers to).

#[allow(unused_imports)]
use super::*;

impl ProcessImage {
    /// Internal consistency, checked before anything looks at the image: every index, length,
    /// offset and address range lies inside what it refers to, with no overflow on the way.
    /// - threads: at least one, positive distinct TIDs, 27 registers, an XSAVE area of at most
    ///   [`XSTATE_MAX`] bytes;
    /// - mappings: page-aligned, non-empty, not overlapping, file indices inside `files`;
    /// - runs: page-aligned, each inside `data_len` and inside one mapping, no two overlapping
    ///   in memory or in the data (so a run's pages cost their own bytes of data);
    /// - encoded pages: page-aligned, inside the data, no delta or compressed form as long as a
    ///   raw page (pages outside the layout are dropped by the receiver, not refused);
    /// - `reset` and `cow` ranges ordered, signal numbers 1–64, descriptors non-negative and
    ///   distinct, no NUL byte in a path, and the private directories' paths as
    ///   [`FileChanges::validate`](crate::files::FileChanges::validate) wants them (whether an
    ///   incremental checkpoint's entries lie in the receiver's directories is for
    ///   [`crate::store::Image::apply`] to check);
    /// - a tree's members and its shared descriptors as `validate_tree` and `validate_shared`
    ///   say.
    pub fn validate(&self, data_len: u64) -> Result<(), FormatError> {
        self.validate_one(data_len, None)?;
        self.validate_tree(data_len)?;
        self.validate_shared()?;
        self.validate_zombies()
    }

    /// The zombies (the main image's; an incremental checkpoint lists every zombie of the
    /// tree at its epoch, as a full one does): each with a positive PID that no
    /// process, thread or other zombie of the tree has, a parent that is the main process or
    /// a member, a group and session not negative, and a status a restore can recreate.
    fn validate_zombies(&self) -> Result<(), FormatError> {
        fn bad<T>(m: String) -> Result<T, FormatError> {
            Err(FormatError::Meta(m))
        }
        if self.zombies.is_empty() {
            return Ok(());
        }
        let procs: Vec<&ProcessImage> = self.processes().collect();
        let mut ids: Vec<i32> = procs
            .iter()
            .flat_map(|p| std::iter::once(p.pid).chain(p.threads.iter().map(|t| t.tid)))
            .collect();
        for z in &self.zombies {
            if z.pid <= 0 || ids.contains(&z.pid) {
                return bad(format!(
                    "zombie {} has a PID that is not positive or not its own",
                    z.pid
                ));
            }
            ids.push(z.pid);
            if !procs.iter().any(|p| p.pid == z.ppid) {
                return bad(format!(
                    "zombie {} names parent {}, which is not a process of the tree",
                    z.pid, z.ppid
                ));
            }
            if z.pgid < 0 || z.sid < 0 {
                return bad(format!(
                    "zombie {} has group {} and session {}",
                    z.pid, z.pgid, z.sid
                ));
            }
            if !Zombie::status_valid(z.status) {
                return bad(format!(
                    "zombie {} has wait status {:#x}, which a restore cannot recreate",
                    z.pid, z.status
                ));
            }
        }
        Ok(())
    }

    /// [`ProcessImage::validate`] of one process, without what belongs to the tree (a
    /// member's descriptors may name shared descriptions, which only the main process lists).
    /// A member's mappings of shared memory name `tree_shm`, the main process's objects.
    pub(crate) fn validate_one(
        &self,
        data_len: u64,
        tree_shm: Option<&[ShmObject]>,
    ) -> Result<(), FormatError> {
        fn bad<T>(m: String) -> Result<T, FormatError> {
            Err(FormatError::Meta(m))
        }
        use crate::delta::PAGE;
        let aligned = |x: u64| x.is_multiple_of(PAGE);
        if self.pid <= 0 {
            return bad(format!("process id {} is not positive", self.pid));
        }
        if let Some(s) = &self.scrub {
            s.validate().map_err(FormatError::Meta)?;
        }
        if self.threads.is_empty() {
            return bad("no threads".into());
        }
        let c = &self.carried;
        if self.base_epoch.is_none() && !c.is_empty() {
            return bad("a full checkpoint leaves out part of its metadata".into());
        }
        let empty = [
            (
                c.layout,
                "mappings",
                self.vmas.is_empty() && self.files.is_empty(),
            ),
            (c.fds, "descriptors", self.fds.is_empty()),
            (c.sigactions, "signal actions", self.sigactions.is_empty()),
        ];
        if let Some((_, what, _)) = empty.iter().find(|(carried, _, empty)| *carried && !empty) {
            return bad(format!("{what} are both carried over and listed"));
        }
        let mut carried_tids = c.threads.clone();
        carried_tids.sort_unstable();
        if let Some(w) = carried_tids.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("thread {} is carried over twice", w[0]));
        }
        let mut tids: Vec<i32> = Vec::with_capacity(self.threads.len());
        for t in &self.threads {
            if t.tid <= 0 {
                return bad(format!("thread id {} is not positive", t.tid));
            }
            if carried_tids.binary_search(&t.tid).is_ok() {
                if !t.regs.is_empty() || !t.xstate.is_empty() || !t.pending.is_empty() {
                    return bad(format!(
                        "thread {} is carried over and has registers of its own",
                        t.tid
                    ));
                }
                tids.push(t.tid);
                continue;
            }
            if t.regs.len() != 27 {
                return bad(format!(
                    "thread {} has {} registers, not 27",
                    t.tid,
                    t.regs.len()
                ));
            }
            if t.xstate.len() > XSTATE_MAX {
                return bad(format!(
                    "thread {} has an XSAVE area of {} bytes (at most {XSTATE_MAX})",
                    t.tid,
                    t.xstate.len()
                ));
            }
            PendingSignal::validate_queue(&t.pending, &format!("thread {}", t.tid))?;
            tids.push(t.tid);
        }
        PendingSignal::validate_queue(&self.pending, &format!("process {}", self.pid))?;
        tids.sort_unstable();
        if let Some(w) = tids.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("thread {} appears twice", w[0]));
        }
        if let Some(t) = carried_tids.iter().find(|t| tids.binary_search(t).is_err()) {
            return bad(format!(
                "carried-over thread {t} is not a thread of the process"
            ));
        }

        let mut spans: Vec<(u64, u64)> = Vec::with_capacity(self.vmas.len());
        for v in &self.vmas {
            if v.start >= v.end || !aligned(v.start) || !aligned(v.end) {
                return bad(format!(
                    "mapping {:#x}-{:#x} is empty or not page-aligned",
                    v.start, v.end
                ));
            }
            if let Backing::File { index, .. } = v.backing
                && index as usize >= self.files.len()
            {
                return bad(format!(
                    "mapping at {:#x} names file #{index} of {}",
                    v.start,
                    self.files.len()
                ));
            }
            spans.push((v.start, v.end));
        }
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
            return bad(format!(
                "mappings {:#x}-{:#x} and {:#x}-{:#x} overlap",
                w[0].0, w[0].1, w[1].0, w[1].1
            ));
        }
        // The mapping holding `addr`, if any (spans are sorted and disjoint).
        let holder = |addr: u64| {
            let i = spans.partition_point(|s| s.0 <= addr);
            i.checked_sub(1).map(|i| spans[i]).filter(|s| addr < s.1)
        };

        for r in &self.runs {
            if !aligned(r.addr) || !aligned(r.len) {
                return bad(format!(
                    "page run at {:#x} ({} bytes) is not page-aligned",
                    r.addr, r.len
                ));
            }
            if r.data_off.checked_add(r.len).is_none_or(|e| e > data_len) {
                return bad(format!(
                    "page run at {:#x} lies outside the page data",
                    r.addr
                ));
            }
            let end = r.addr.checked_add(r.len);
            let inside = holder(r.addr).zip(end).is_some_and(|(s, e)| e <= s.1);
            if r.len > 0 && !inside {
                return bad(format!(
                    "page run at {:#x} ({} bytes) lies outside every mapping",
                    r.addr, r.len
                ));
            }
        }
        // A shared mapping's contents are its object's, never page runs of their own.
        let shm_spans: Vec<(u64, u64)> = self
            .vmas
            .iter()
            .filter(|v| matches!(v.backing, Backing::Shm { .. }))
            .map(|v| (v.start, v.end))
            .collect();
        if let Some(r) = self
            .runs
            .iter()
            .find(|r| r.len > 0 && shm_spans.iter().any(|s| s.0 <= r.addr && r.addr < s.1))
        {
            return bad(format!(
                "page run at {:#x} lies in a mapping of shared memory",
                r.addr
            ));
        }
        let mut by_addr: Vec<(u64, u64)> = self.runs.iter().map(|r| (r.addr, r.len)).collect();
        let mut by_data: Vec<(u64, u64)> = self.runs.iter().map(|r| (r.data_off, r.len)).collect();
        for (what, set) in [("memory", &mut by_addr), ("the page data", &mut by_data)] {
            set.retain(|r| r.1 > 0);
            set.sort_unstable();
            // Each run's end is known not to overflow (checked above).
            if let Some(w) = set.windows(2).find(|w| w[1].0 < w[0].0 + w[0].1) {
                return bad(format!(
                    "page runs overlap in {what} (at {:#x} and {:#x})",
                    w[0].0, w[1].0
                ));
            }
        }

        for p in &self.pages {
            if !aligned(p.addr) {
                return bad(format!("page at {:#x} is not page-aligned", p.addr));
            }
            let len = p.enc.encoded_len() as u64;
            if matches!(
                p.enc,
                PageEncoding::Delta { .. } | PageEncoding::Compressed { .. }
            ) && len >= PAGE
            {
                return bad(format!(
                    "page at {:#x} is encoded as {:?}: not shorter than a raw page",
                    p.addr, p.enc
                ));
            }
            if p.data_off.checked_add(len).is_none_or(|e| e > data_len) {
                return bad(format!("page at {:#x} lies outside the page data", p.addr));
            }
        }
        for (what, set) in [("reset", &self.reset), ("copied-on-write", &self.cow)] {
            if let Some(&(s, e)) = set.iter().find(|(s, e)| s > e) {
                return bad(format!("{what} range {s:#x}-{e:#x} ends before it starts"));
            }
        }

        if let Some(s) = self
            .sigactions
            .iter()
            .find(|s| !(1..=64).contains(&s.signo))
        {
            return bad(format!("signal action for signal {}", s.signo));
        }
        let mut fds: Vec<i32> = self.fds.iter().map(|f| f.fd).collect();
        fds.sort_unstable();
        if let Some(&fd) = fds.first().filter(|&&fd| fd < 0) {
            return bad(format!("descriptor {fd} is negative"));
        }
        if let Some(w) = fds.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("descriptor {} appears twice", w[0]));
        }

        // Paths become C strings on restore.
        let paths = [
            ("executable", &self.exe.path),
            ("working directory", &self.cwd),
        ]
        .into_iter()
        .chain(self.files.iter().map(|f| ("mapped file", &f.path)));
        for (what, p) in paths {
            if p.contains('\0') {
                return bad(format!("{what} {p:?} contains a NUL byte"));
            }
        }
        for f in &self.fds {
            validate_fd(f)?;
        }
        self.validate_tcp()?;
        self.validate_timers(&tids)?;
        self.validate_seccomp(&tids)?;
        self.validate_shm(data_len, tree_shm)?;
        self.creds
            .groups
            .len()
            .le(&65536)
            .then_some(())
            .ok_or_else(|| FormatError::Meta("more than 65,536 supplementary groups".into()))?;
        if self.pgid < 0 || self.sid < 0 {
            return bad(format!(
                "process {} has group {} and session {}",
                self.pid, self.pgid, self.sid
            ));
        }
        self.private_files.validate(None).map_err(FormatError::Meta)
    }

    /// The members of a tree (none inside a member): each one's data slice after the main
    /// process's data and the previous member's, inside the data; its image valid against its
    /// slice, of the same kind as the main process's (full, or incremental on the same base);
    /// every PID and TID of the tree distinct; each parent the main process or an earlier
    /// member; groups and sessions not negative.
    fn validate_tree(&self, data_len: u64) -> Result<(), FormatError> {
        fn bad<T>(m: String) -> Result<T, FormatError> {
            Err(FormatError::Meta(m))
        }
        if self.tree.is_empty() {
            return Ok(());
        }
        // Where the main process's data ends (runs, encoded pages and shared memory runs lie
        // inside the data: checked above).
        let mut end = self
            .runs
            .iter()
            .chain(self.shm.iter().flat_map(|o| &o.runs))
            .map(|r| r.data_off.saturating_add(r.len))
            .chain(
                self.pages
                    .iter()
                    .map(|p| p.data_off.saturating_add(p.enc.encoded_len() as u64)),
            )
            .max()
            .unwrap_or(0);
        let mut ids: Vec<i32> = std::iter::once(self.pid)
            .chain(self.threads.iter().map(|t| t.tid))
            .collect();
        let mut pids = vec![self.pid];
        for m in &self.tree {
            let img = &m.image;
            if !img.tree.is_empty() {
                return bad(format!("process {} holds processes of its own", img.pid));
            }
            match (self.base_epoch, img.base_epoch) {
                (None, Some(_)) => {
                    return bad(format!(
                        "process {} is incremental in a full checkpoint",
                        img.pid
                    ));
                }
                // A process that appeared (or ran `execve`) since the base: whole, a "fresh"
                // member (see `store::Image::apply`).
                (Some(_), None) => {}
                (Some(a), Some(b)) if a != b => {
                    return bad(format!(
                        "process {} applies to epoch {b}, the main process to epoch {a}",
                        img.pid
                    ));
                }
                _ => {}
            }
            let f = &img.private_files;
            if !f.dirs.is_empty()
                || !f.upsert.is_empty()
                || !f.remove.is_empty()
                || !f.owners.is_empty()
            {
                return bad(format!(
                    "process {} carries private files (the main process carries them)",
                    img.pid
                ));
            }
            let m_end = m.data_off.checked_add(m.data_len);
            if m.data_off < end || m_end.is_none_or(|e| e > data_len) {
                return bad(format!(
                    "the page data of process {} overlaps another's or lies outside the data",
                    img.pid
                ));
            }
            if !img.shared_files.is_empty() {
                return bad(format!(
                    "process {} lists shared descriptors (the main process lists them)",
                    img.pid
                ));
            }
            if !img.zombies.is_empty() {
                return bad(format!(
                    "process {} lists zombies (the main process lists them)",
                    img.pid
                ));
            }
            img.validate_one(m.data_len, Some(&self.shm))
                .map_err(|e| match e {
                    FormatError::Meta(m) => FormatError::Meta(format!("process {}: {m}", img.pid)),
                    e => e,
                })?;
            if !pids.contains(&m.ppid) {
                return bad(format!(
                    "process {} names parent {}, which is not listed before it",
                    img.pid, m.ppid
                ));
            }
            let tids = img.threads.iter().map(|t| t.tid).filter(|&t| t != img.pid);
            for id in std::iter::once(img.pid).chain(tids) {
                if ids.contains(&id) {
                    return bad(format!("process or thread {id} appears twice in the tree"));
                }
                ids.push(id);
            }
            pids.push(img.pid);
            end = m_end.unwrap_or(data_len);
        }
        Ok(())
    }
}

impl ProcessImage {
    /// The shared descriptions (a tree's main process only): each one a
    /// valid descriptor that is neither itself a reference to a shared one nor an epoll
    /// instance (whose interest list names descriptor numbers of one process), held at least
    /// once; each holder a process of the tree and a descriptor of it that names this entry;
    /// every descriptor that names an entry listed among its holders (so no descriptor is
    /// both private and shared, and none names an entry out of range). In an incremental
    /// checkpoint, a process whose descriptors are carried over from the base is checked by
    /// the receiver, on the resolved descriptors.
    fn validate_shared(&self) -> Result<(), FormatError> {
        fn bad<T>(m: String) -> Result<T, FormatError> {
            Err(FormatError::Meta(m))
        }
        // Every descriptor of the tree that names a shared entry: (pid, fd, index).
        let procs = self.processes();
        let mut named: Vec<(i32, i32, u32)> = Vec::new();
        for p in procs.clone() {
            for f in &p.fds {
                if let FdKind::Shared(i) = f.kind {
                    if i as usize >= self.shared_files.len() {
                        return bad(format!(
                            "descriptor {} of process {} names shared description #{i} of {}",
                            f.fd,
                            p.pid,
                            self.shared_files.len()
                        ));
                    }
                    named.push((p.pid, f.fd, i));
                }
            }
        }
        if self.shared_files.is_empty() {
            return Ok(());
        }
        if self.tree.is_empty() {
            return bad("a single process lists shared descriptors".into());
        }
        let mut held: Vec<(i32, i32, u32)> = Vec::with_capacity(named.len());
        for (i, s) in self.shared_files.iter().enumerate() {
            match s.file.kind {
                FdKind::Shared(_) => {
                    return bad(format!(
                        "shared description #{i} names another shared description"
                    ));
                }
                FdKind::Epoll { .. } => {
                    return bad(format!("shared description #{i} is an epoll instance"));
                }
                _ => {}
            }
            validate_fd(&s.file).map_err(|e| match e {
                FormatError::Meta(m) => FormatError::Meta(format!("shared description #{i}: {m}")),
                e => e,
            })?;
            if s.holders.is_empty() {
                return bad(format!("shared description #{i} has no holder"));
            }
            for &(pid, fd) in &s.holders {
                let Some(p) = procs.clone().find(|p| p.pid == pid) else {
                    return bad(format!(
                        "shared description #{i} is held by process {pid}, which is not in the tree"
                    ));
                };
                // An incremental checkpoint may carry a process's descriptors over from its
                // base: the receiver checks them once resolved (`store::Image::apply`).
                let listed = !p.carried.fds;
                match p.fds.iter().find(|f| f.fd == fd).map(|f| &f.kind) {
                    _ if !listed => {}
                    Some(FdKind::Shared(j)) if *j as usize == i => {}
                    Some(FdKind::Shared(j)) => {
                        return bad(format!(
                            "shared description #{i} is held as descriptor {fd} of process {pid}, \
                             which names shared description #{j}"
                        ));
                    }
                    Some(_) => {
                        return bad(format!(
                            "descriptor {fd} of process {pid} is both private and shared \
                             description #{i}"
                        ));
                    }
                    None => {
                        return bad(format!(
                            "shared description #{i} is held as descriptor {fd} of process {pid}, \
                             which has no such descriptor"
                        ));
                    }
                }
                held.push((pid, fd, i as u32));
            }
        }
        held.sort_unstable();
        if let Some(w) = held.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!(
                "shared description #{} lists holder ({}, {}) twice",
                w[0].2, w[0].0, w[0].1
            ));
        }
        // The objects the restore makes whole from shared entries (a pipe, connected unix
        // sockets) have no part left private: it would be made a second time, apart.
        let mut pipes: Vec<u64> = Vec::new();
        let mut sockets: Vec<u64> = Vec::new();
        for s in &self.shared_files {
            match &s.file.kind {
                FdKind::Pipe { id, .. } => pipes.push(*id),
                FdKind::Unix(u) => sockets.push(u.ino),
                _ => {}
            }
        }
        pipes.sort_unstable();
        sockets.sort_unstable();
        for p in procs {
            for f in &p.fds {
                let apart = match &f.kind {
                    FdKind::Pipe { id, .. } => pipes.binary_search(id).is_ok(),
                    FdKind::Unix(u) => {
                        sockets.binary_search(&u.ino).is_ok()
                            || sockets.binary_search(&u.peer_ino).is_ok()
                    }
                    _ => false,
                };
                if apart {
                    return bad(format!(
                        "descriptor {} of process {} is private but belongs with a shared \
                         pipe or unix socket",
                        f.fd, p.pid
                    ));
                }
            }
        }
        named.sort_unstable();
        // Every holder names its entry (checked above) and none is listed twice: the lists
        // agree when they have the same length; otherwise a descriptor names an entry that
        // does not list it.
        if let Some(&(pid, fd, i)) = named.iter().find(|n| held.binary_search(n).is_err()) {
            return bad(format!(
                "descriptor {fd} of process {pid} names shared description #{i}, which does not \
                 list it as a holder"
            ));
        }
        Ok(())
    }
}

/// What one descriptor must satisfy wherever it is listed: paths without NUL bytes (they
/// become C strings on restore), unix socket addresses and types Linux has, inotify watches
/// with positive, distinct numbers and paths.
pub(super) fn validate_fd(f: &FdImage) -> Result<(), FormatError> {
    fn bad<T>(m: String) -> Result<T, FormatError> {
        Err(FormatError::Meta(m))
    }
    match &f.kind {
        FdKind::Path { path, .. } if path.contains('\0') => {
            bad(format!("descriptor path {path:?} contains a NUL byte"))
        }
        FdKind::Unix(u) => {
            u.local.check().or_else(bad)?;
            u.peer.check().or_else(bad)?;
            if ![
                libc_types::SOCK_STREAM,
                libc_types::SOCK_DGRAM,
                libc_types::SOCK_SEQPACKET,
            ]
            .contains(&u.ty)
            {
                return bad(format!(
                    "unix socket of descriptor {} has type {}",
                    f.fd, u.ty
                ));
            }
            Ok(())
        }
        FdKind::Inotify { watches } => {
            let mut wds: Vec<i32> = watches.iter().map(|w| w.wd).collect();
            wds.sort_unstable();
            if let Some(&wd) = wds.first().filter(|&&wd| wd <= 0) {
                return bad(format!("inotify descriptor {} has watch {wd}", f.fd));
            }
            if let Some(w) = wds.windows(2).find(|w| w[0] == w[1]) {
                return bad(format!(
                    "inotify descriptor {} has watch {} twice",
                    f.fd, w[0]
                ));
            }
            if let Some(w) = watches
                .iter()
                .find(|w| w.path.is_empty() || w.path.contains('\0'))
            {
                return bad(format!(
                    "inotify watch {} of descriptor {} has path {:?}",
                    w.wd, f.fd, w.path
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

impl ProcessImage {
    /// Timer ids non-negative and distinct, notification kinds Linux knows, a thread-directed
    /// timer naming a thread of the image, signals 1–64 (0 allowed for `SIGEV_NONE`), times
    /// that fit a `timespec`, interval timers 0–2 and each at most once.
    /// Connections: each names a connected TCP socket of the process (when the descriptors
    /// are listed), once, in a state a restore can carry on, with queues a socket can hold.
    fn validate_tcp(&self) -> Result<(), FormatError> {
        let bad = |m: String| Err(FormatError::Meta(m));
        let mut named: Vec<i32> = self.tcp.iter().map(|t| t.fd).collect();
        named.extend(&self.carried.tcp);
        named.sort_unstable();
        if let Some(w) = named.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!(
                "the connection of descriptor {} is given twice",
                w[0]
            ));
        }
        for t in &self.tcp {
            if !TCP_CARRIED_STATES.contains(&t.state) {
                return bad(format!(
                    "the connection of descriptor {} is in TCP state {}, which no restore carries",
                    t.fd, t.state
                ));
            }
            if t.send_queue.len() > TCP_MAX_QUEUE || t.recv_queue.len() > TCP_MAX_QUEUE {
                return bad(format!(
                    "the connection of descriptor {} queues more than {TCP_MAX_QUEUE} bytes",
                    t.fd
                ));
            }
            if t.unsent as usize > t.send_queue.len() {
                return bad(format!(
                    "the connection of descriptor {} has {} unsent bytes of {} queued",
                    t.fd,
                    t.unsent,
                    t.send_queue.len()
                ));
            }
            if t.wscale.is_some_and(|(s, r)| s > 14 || r > 14) {
                return bad(format!(
                    "the connection of descriptor {} has a window scale above 14",
                    t.fd
                ));
            }
        }
        if !self.carried.fds || self.base_epoch.is_none() {
            for &fd in &named {
                let connected = self.fds.iter().any(|f| {
                    f.fd == fd
                        && matches!(&f.kind, FdKind::Socket(s) if s.state == SocketState::ConnectedTcp)
                });
                if !connected {
                    return bad(format!(
                        "descriptor {fd} has a TCP connection but is no connected TCP socket"
                    ));
                }
            }
        }
        Ok(())
    }

    fn validate_timers(&self, tids: &[i32]) -> Result<(), FormatError> {
        let bad = |m: String| Err(FormatError::Meta(m));
        // Seconds must fit an i64 timespec: any u64 of nanoseconds does.
        let mut ids: Vec<i32> = Vec::with_capacity(self.timers.posix.len());
        for t in &self.timers.posix {
            if t.id < 0 {
                return bad(format!("POSIX timer id {} is negative", t.id));
            }
            ids.push(t.id);
            match t.notify {
                sigev::SIGNAL | sigev::THREAD | sigev::THREAD_ID => {
                    if !(1..=64).contains(&t.signo) {
                        return bad(format!("POSIX timer {} signals {}", t.id, t.signo));
                    }
                }
                sigev::NONE if (0..=64).contains(&t.signo) => {}
                _ => {
                    return bad(format!(
                        "POSIX timer {} has notification {} (signal {})",
                        t.id, t.notify, t.signo
                    ));
                }
            }
            if t.notify == sigev::THREAD_ID && tids.binary_search(&t.tid).is_err() {
                return bad(format!(
                    "POSIX timer {} signals thread {}, which is not in the image",
                    t.id, t.tid
                ));
            }
        }
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("POSIX timer {} appears twice", w[0]));
        }
        let mut which: Vec<u32> = self.timers.itimers.iter().map(|t| t.which).collect();
        which.sort_unstable();
        if let Some(&w) = which.iter().find(|&&w| w > 2) {
            return bad(format!("interval timer {w}"));
        }
        if let Some(w) = which.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("interval timer {} appears twice", w[0]));
        }
        Ok(())
    }

    /// Shared memory objects: distinct ids (System V ones non-negative, with their
    /// description, anonymous ones without), sizes of 1 byte to [`SHM_MAX_SIZE`], runs
    /// page-aligned, inside the object (rounded up to pages) and inside the data, not
    /// overlapping one another in the object; `fresh` only in an incremental checkpoint; and
    /// every mapping of one naming an object of the image, inside it. A member of a tree
    /// (`tree_shm`: the main process's objects, already checked) lists none of its own, and
    /// its mappings name the main process's.
    fn validate_shm(
        &self,
        data_len: u64,
        tree_shm: Option<&[ShmObject]>,
    ) -> Result<(), FormatError> {
        let bad = |m: String| Err(FormatError::Meta(m));
        use crate::delta::PAGE;
        if tree_shm.is_some() && !self.shm.is_empty() {
            return bad(format!(
                "process {} lists shared memory objects (the main process lists a tree's)",
                self.pid
            ));
        }
        let mut ids: Vec<(ShmId, u64)> = Vec::with_capacity(self.shm.len());
        for o in tree_shm.unwrap_or_default() {
            ids.push((o.id, o.size.div_ceil(PAGE).saturating_mul(PAGE)));
        }
        for o in &self.shm {
            if o.size == 0 || o.size > SHM_MAX_SIZE {
                return bad(format!("shared memory {:?} has size {}", o.id, o.size));
            }
            match (o.id, &o.sysv) {
                (ShmId::Sysv(id), Some(_)) if id >= 0 => {}
                (id, None) if id.is_anonymous() => {}
                _ => return bad(format!("shared memory {:?} is described wrongly", o.id)),
            }
            if o.fresh && self.base_epoch.is_none() {
                return bad(format!(
                    "shared memory {:?} is fresh in a full checkpoint",
                    o.id
                ));
            }
            let size = o.size.div_ceil(PAGE) * PAGE;
            let mut spans: Vec<(u64, u64)> = Vec::with_capacity(o.runs.len());
            for r in &o.runs {
                let end = r.addr.checked_add(r.len);
                if !r.addr.is_multiple_of(PAGE)
                    || !r.len.is_multiple_of(PAGE)
                    || end.is_none_or(|e| e > size)
                    || r.data_off.checked_add(r.len).is_none_or(|e| e > data_len)
                {
                    return bad(format!(
                        "a page run of shared memory {:?} ({} bytes at {:#x}) lies outside it \
                         or the page data",
                        o.id, r.len, r.addr
                    ));
                }
                if r.len > 0 {
                    spans.push((r.addr, r.len));
                }
            }
            spans.sort_unstable();
            if spans.windows(2).any(|w| w[1].0 < w[0].0 + w[0].1) {
                return bad(format!("page runs of shared memory {:?} overlap", o.id));
            }
            ids.push((o.id, size));
        }
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0].0 == w[1].0) {
            return bad(format!("shared memory {:?} appears twice", w[0].0));
        }
        for v in &self.vmas {
            if let Backing::Shm { id, offset } = v.backing {
                let Ok(i) = ids.binary_search_by_key(&id, |x| x.0) else {
                    return bad(format!(
                        "mapping at {:#x} names shared memory {id:?}, which is not in the image",
                        v.start
                    ));
                };
                if !offset.is_multiple_of(PAGE)
                    || offset
                        .checked_add(v.end - v.start)
                        .is_none_or(|e| e > ids[i].1)
                {
                    return bad(format!(
                        "mapping at {:#x} lies outside shared memory {id:?}",
                        v.start
                    ));
                }
            }
        }
        Ok(())
    }

    /// Filters of 1 to [`SECCOMP_MAX_INSNS`] instructions with no flag but `LOG`; chains of
    /// threads of the image, each thread once, indices inside the filters, at most
    /// [`SECCOMP_MAX_PATH`] instructions per chain as the kernel counts them.
    fn validate_seccomp(&self, tids: &[i32]) -> Result<(), FormatError> {
        let bad = |m: String| Err(FormatError::Meta(m));
        for (i, f) in self.seccomp.filters.iter().enumerate() {
            if f.insns.is_empty() || f.insns.len() > SECCOMP_MAX_INSNS {
                return bad(format!(
                    "seccomp filter #{i} has {} instructions",
                    f.insns.len()
                ));
            }
            if f.flags & !2 != 0 {
                return bad(format!("seccomp filter #{i} has flags {:#x}", f.flags));
            }
        }
        let mut seen: Vec<i32> = Vec::with_capacity(self.seccomp.chains.len());
        for c in &self.seccomp.chains {
            if tids.binary_search(&c.tid).is_err() {
                return bad(format!(
                    "seccomp filters of thread {}, which is not in the image",
                    c.tid
                ));
            }
            seen.push(c.tid);
            let mut total = 0usize;
            for &i in &c.filters {
                let Some(f) = self.seccomp.filters.get(i as usize) else {
                    return bad(format!(
                        "thread {} names seccomp filter #{i} of {}",
                        c.tid,
                        self.seccomp.filters.len()
                    ));
                };
                total += f.insns.len() + 4;
            }
            if c.filters.is_empty() || total > SECCOMP_MAX_PATH {
                return bad(format!(
                    "thread {} has a chain of {} seccomp filters ({total} instructions)",
                    c.tid,
                    c.filters.len()
                ));
            }
        }
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("seccomp filters of thread {} appear twice", w[0]));
        }
        Ok(())
    }
}
