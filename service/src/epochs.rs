//! The one translation of a manifest's `[tardi.epoch]` and `[tardi.scrub]` tables into the
//! epoch loop's configuration, used by the replication daemon and by `tardi profile` (which
//! then applies its own flags on top).

use std::time::Duration;
use tardi_checkpointer::epoch::EpochConfig;
use tardi_checkpointer::scrub::ScrubConfig;
use tardi_manifest::Manifest;

/// The epoch loop's configuration for a service of manifest `m` whose checkpoints carry the
/// files of `private_dirs` ([`crate::private_dirs`]). What the manifest does not set keeps
/// [`EpochConfig::default`].
pub fn epoch_config(m: &Manifest, private_dirs: Vec<String>) -> EpochConfig {
    let e = &m.tardi.epoch;
    let ms = |v: f64| Duration::from_secs_f64(v.max(0.0) / 1e3);
    EpochConfig {
        interval: ms(e.interval_ms),
        min_interval: ms(e.min_ms),
        cap_pages: e.cap_pages,
        hot_epochs: e.hot_epochs,
        tracker: e.tracker.parse().unwrap_or_default(),
        precopy_min_pages: e.precopy_min_pages,
        encode_budget: e.encode_budget,
        private_dirs,
        follow_releases: e.follow_releases,
        follow_min: ms(e.follow_min_ms),
        after_release: ms(e.after_release_ms),
        scrub: (m.tardi.scrub.interval_ms > 0).then(|| ScrubConfig {
            every: Duration::from_millis(m.tardi.scrub.interval_ms),
            pages: m.tardi.scrub.pages as usize,
        }),
        ..EpochConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_epoch_setting_of_a_manifest_reaches_the_loop() {
        let text = r#"
libos.entrypoint = "/usr/bin/true"
[tardi]
name = "t"
ports = ["tcp:1"]
[tardi.epoch]
interval_ms = 20
min_ms = 2.5
cap_pages = 123
hot_epochs = 7
tracker = "mprotect"
precopy_min_pages = 9
encode_budget = 11
follow_releases = false
follow_min_ms = 0.5
after_release_ms = 3
[tardi.scrub]
interval_ms = 500
pages = 64
"#;
        let mut m = tardi_manifest::parse(text, std::path::Path::new("t.manifest")).unwrap();
        let c = epoch_config(&m, vec!["/data".into()]);
        assert_eq!(c.interval, Duration::from_millis(20));
        assert_eq!(c.min_interval, Duration::from_micros(2500));
        assert_eq!((c.cap_pages, c.hot_epochs), (123, 7));
        assert_eq!(c.tracker, tardi_checkpointer::track::TrackerKind::Mprotect);
        assert_eq!((c.precopy_min_pages, c.encode_budget), (9, 11));
        assert!(!c.follow_releases);
        assert_eq!(c.follow_min, Duration::from_micros(500));
        assert_eq!(c.after_release, Duration::from_millis(3));
        let s = c.scrub.expect("the scrub is on");
        assert_eq!((s.every, s.pages), (Duration::from_millis(500), 64));
        assert_eq!(c.private_dirs, vec!["/data".to_string()]);
        m.tardi.scrub.interval_ms = 0;
        assert!(epoch_config(&m, Vec::new()).scrub.is_none());
    }
}
