//! The resources a process holds besides its memory and threads, one module each, with its
//! capture half and its restore half side by side (and the plan types the restore builds for
//! it): descriptors ([`fds`]), Unix sockets ([`unix`]), inotify ([`inotify`]), shared memory
//! ([`shm`]), timers ([`timers`]), seccomp filters ([`seccomp`]), credentials ([`creds`]) and
//! the private directories' files ([`files`]).
//!
//! Owns: reading one kind of resource from a stopped process and recreating it.
//! Must not touch: the capture's or the restore's sequencing, the trackers, the epoch loop
//! (they call in here, never the other way); a resource may use another resource, the
//! in-process agent and the OS layer (`crate::os`).

pub mod creds;
pub mod fds;
pub mod files;
pub mod inotify;
pub mod seccomp;
pub mod shm;
pub mod tcp;
pub mod timers;
pub mod unix;
