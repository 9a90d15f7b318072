//! `--out`: the data files (epochs.json, summary.json) and the plots (PNG and SVG).

use super::stats::{EpochLine, Rec, Summary};
use anyhow::{Context, anyhow};
use std::path::Path;
use tardi_checkpointer::epoch::EpochConfig;

/// Writes `epochs.json`, `summary.json` and the plots into `dir`.
pub(super) fn write_outputs(
    dir: &Path,
    s: &Summary,
    recs: &[Rec],
    cfg: &EpochConfig,
) -> anyhow::Result<()> {
    let lines: Vec<EpochLine> = recs.iter().map(Rec::line).collect();
    let write = |file: &str, bytes: Vec<u8>| -> anyhow::Result<()> {
        let p = dir.join(file);
        std::fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))
    };
    write("epochs.json", serde_json::to_vec_pretty(&lines)?)?;
    write("summary.json", serde_json::to_vec_pretty(s)?)?;
    plots::draw_all(dir, s, recs, cfg).context("drawing the plots")
}

/// Makes a TrueType font available to the plots (see [`crate::plot_font`]).
pub(super) fn load_font() -> anyhow::Result<()> {
    crate::plot_font::load_font().map_err(|e| anyhow!(e))
}

mod plots {
    use super::{Rec, Summary};
    use anyhow::anyhow;
    use plotters::coord::Shift;
    use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
    use plotters::coord::types::RangedCoordf64;
    use plotters::prelude::*;
    use std::path::Path;
    use tardi_checkpointer::epoch::EpochConfig;

    const SIZE: (u32, u32) = (1100, 650);
    const ENCODED: RGBColor = RGBColor(31, 119, 180);
    const RAW: RGBColor = RGBColor(214, 39, 40);
    const GUIDE: RGBColor = RGBColor(120, 120, 120);

    fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
        anyhow!("{e}")
    }

    /// A legend's mark for a series: a short line in `color`.
    fn legend_mark(color: RGBColor, width: u32) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
        move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(width))
    }

    /// Draws the legend box of `chart`'s labelled series at `position`.
    fn draw_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
        chart: &mut ChartContext<'a, DB, CT>,
        position: SeriesLabelPosition,
    ) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        chart
            .configure_series_labels()
            .position(position)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 16))
            .draw()
            .map_err(err)
    }

    /// An axis label without needless decimals.
    fn short(v: f64) -> String {
        let a = v.abs();
        if a == 0.0 || a >= 100.0 {
            format!("{v:.0}")
        } else if a >= 10.0 {
            format!("{v:.1}").trim_end_matches(".0").to_string()
        } else if a >= 0.1 {
            let s = format!("{v:.2}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            format!("{v:.1e}")
        }
    }

    pub fn draw_all(
        dir: &Path,
        s: &Summary,
        recs: &[Rec],
        cfg: &EpochConfig,
    ) -> anyhow::Result<()> {
        super::load_font()?;
        let size = SizeData::new(s, recs);
        let interval = CdfData::new(
            "Epoch interval",
            recs.iter().map(|r| r.st.interval_us).collect(),
            Some(cfg.interval.as_secs_f64() * 1e6),
            "configured interval",
        );
        let pause = CdfData::new(
            "Pause of the service per epoch",
            recs.iter().map(|r| r.st.pause_us).collect(),
            None,
            "",
        );
        for (stem, what) in [
            ("checkpoint-size", Chart::Size(&size)),
            ("interval-cdf", Chart::Cdf(&interval)),
            ("pause-cdf", Chart::Cdf(&pause)),
        ] {
            let png = dir.join(format!("{stem}.png"));
            let root = BitMapBackend::new(&png, SIZE).into_drawing_area();
            what.draw(&root)
                .map_err(|e| e.context(format!("drawing {}", png.display())))?;
            root.present()
                .map_err(|e| anyhow!("writing {}: {e}", png.display()))?;
            drop(root);
            let svg = dir.join(format!("{stem}.svg"));
            let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
            what.draw(&root)
                .map_err(|e| e.context(format!("drawing {}", svg.display())))?;
            root.present()
                .map_err(|e| anyhow!("writing {}: {e}", svg.display()))?;
        }
        Ok(())
    }

    enum Chart<'a> {
        Size(&'a SizeData),
        Cdf(&'a CdfData),
    }

    impl Chart<'_> {
        fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>
        where
            DB::ErrorType: 'static,
        {
            root.fill(&WHITE).map_err(err)?;
            match self {
                Chart::Size(d) => d.draw(root),
                Chart::Cdf(d) => d.draw(root),
            }
        }
    }

    /// Checkpoint size per epoch over time.
    struct SizeData {
        title: String,
        /// (time s, encoded KiB, raw KiB)
        points: Vec<(f64, f64, f64)>,
        t_max: f64,
        lo: f64,
        hi: f64,
        log: bool,
    }

    impl SizeData {
        fn new(s: &Summary, recs: &[Rec]) -> SizeData {
            let points: Vec<(f64, f64, f64)> = recs
                .iter()
                .map(|r| {
                    (
                        r.time_us as f64 / 1e6,
                        r.st.encoded_bytes as f64 / 1024.0,
                        r.st.raw_bytes as f64 / 1024.0,
                    )
                })
                .collect();
            let max = points.iter().map(|p| p.1.max(p.2)).fold(0.0, f64::max);
            let min_pos = points
                .iter()
                .flat_map(|p| [p.1, p.2])
                .filter(|v| *v > 0.0)
                .fold(f64::INFINITY, f64::min);
            let log = min_pos.is_finite() && max / min_pos > 100.0;
            let (lo, hi) = if log {
                (min_pos / 2.0, max * 2.0)
            } else {
                (0.0, if max > 0.0 { max * 1.1 } else { 1.0 })
            };
            SizeData {
                title: format!(
                    "Checkpoint size per epoch: {} ({} epochs, codec {})",
                    s.name, s.epochs, s.config.codec
                ),
                t_max: points.last().map_or(1.0, |p| p.0).max(1e-3),
                points,
                lo,
                hi,
                log,
            }
        }

        fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>
        where
            DB::ErrorType: 'static,
        {
            if self.log {
                self.draw_with(
                    root,
                    (self.lo..self.hi).log_scale(),
                    "KiB per epoch (log scale)",
                )
            } else {
                self.draw_with(root, self.lo..self.hi, "KiB per epoch")
            }
        }

        fn draw_with<DB: DrawingBackend, Y>(
            &self,
            root: &DrawingArea<DB, Shift>,
            y: Y,
            y_desc: &str,
        ) -> anyhow::Result<()>
        where
            DB::ErrorType: 'static,
            Y: AsRangedCoord<Value = f64>,
            Y::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
        {
            let floor = self.lo;
            let mut chart = ChartBuilder::on(root)
                .caption(&self.title, ("sans-serif", 26))
                .margin(20)
                .x_label_area_size(50)
                .y_label_area_size(80)
                .build_cartesian_2d(0.0..self.t_max * 1.02, y)
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc("time since the full checkpoint (s)")
                .y_desc(y_desc)
                .y_label_formatter(&|v| short(*v))
                .axis_desc_style(("sans-serif", 20))
                .label_style(("sans-serif", 16))
                .light_line_style(RGBColor(235, 235, 235))
                .draw()
                .map_err(err)?;
            let few = self.points.len() <= 300;
            for (label, color, pick) in [
                (
                    "raw (dirty + fresh pages x 4 KiB)",
                    RAW,
                    (|p: &(f64, f64, f64)| p.2) as fn(&(f64, f64, f64)) -> f64,
                ),
                ("encoded (what replication sends)", ENCODED, |p| p.1),
            ] {
                let series: Vec<(f64, f64)> = self
                    .points
                    .iter()
                    .map(|p| (p.0, pick(p).max(floor)))
                    .collect();
                chart
                    .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))
                    .map_err(err)?
                    .label(label)
                    .legend(legend_mark(color, 3));
                if few {
                    chart
                        .draw_series(
                            series
                                .into_iter()
                                .map(|(x, y)| Circle::new((x, y), 3, color.filled())),
                        )
                        .map_err(err)?;
                }
            }
            draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
        }
    }

    /// The CDF of per-epoch durations (µs), drawn in µs or ms.
    struct CdfData {
        title: String,
        /// Sorted values, in the unit of the x axis.
        values: Vec<f64>,
        unit: &'static str,
        x_min: f64,
        x_max: f64,
        guide: Option<(f64, &'static str)>,
    }

    impl CdfData {
        fn new(what: &str, us: Vec<u64>, guide_us: Option<f64>, guide: &'static str) -> CdfData {
            let mut us = us;
            us.sort_unstable();
            let max_us = us.last().copied().unwrap_or(0) as f64;
            let (unit, div) = if max_us.max(guide_us.unwrap_or(0.0)) >= 2000.0 {
                ("ms", 1e3)
            } else {
                ("µs", 1.0)
            };
            let values: Vec<f64> = us.iter().map(|&v| v as f64 / div).collect();
            let pct = |p: f64| {
                if values.is_empty() {
                    0.0
                } else {
                    crate::profile::stats::nearest_rank(&values, p)
                }
            };
            let fmt = |v: f64| {
                if v >= 100.0 {
                    format!("{v:.0}")
                } else if v >= 10.0 {
                    format!("{v:.1}")
                } else {
                    format!("{v:.2}")
                }
            };
            let guide = guide_us.map(|g| (g / div, guide));
            let hi = values
                .last()
                .copied()
                .unwrap_or(0.0)
                .max(guide.map_or(0.0, |g| g.0));
            let lo = values
                .first()
                .copied()
                .unwrap_or(0.0)
                .min(guide.map_or(f64::INFINITY, |g| g.0));
            // Zoom in when every value sits far from zero (e.g. intervals close to the target).
            let x_min = if lo > 0.5 * hi {
                lo - (hi - lo).max(hi * 0.02) * 0.5
            } else {
                0.0
            };
            let x_max = hi + (hi - x_min).max(hi * 0.02) * 0.05;
            CdfData {
                title: format!(
                    "{what}: CDF over {} epochs (p50 {} {unit}, p99 {} {unit}, max {} {unit})",
                    values.len(),
                    fmt(pct(0.5)),
                    fmt(pct(0.99)),
                    fmt(values.last().copied().unwrap_or(0.0)),
                ),
                x_max: if x_max > x_min { x_max } else { x_min + 1.0 },
                x_min,
                values,
                unit,
                guide,
            }
        }

        fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>
        where
            DB::ErrorType: 'static,
        {
            let mut chart: ChartContext<DB, Cartesian2d<RangedCoordf64, RangedCoordf64>> =
                ChartBuilder::on(root)
                    .caption(&self.title, ("sans-serif", 24))
                    .margin(20)
                    .x_label_area_size(50)
                    .y_label_area_size(80)
                    .build_cartesian_2d(self.x_min..self.x_max, 0.0..1.0)
                    .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc(format!("duration ({})", self.unit))
                .x_label_formatter(&|v| short(*v))
                .y_desc("fraction of epochs <= x")
                .axis_desc_style(("sans-serif", 20))
                .label_style(("sans-serif", 16))
                .light_line_style(RGBColor(235, 235, 235))
                .draw()
                .map_err(err)?;
            // A step function: at each value the fraction rises by 1/n.
            let n = self.values.len() as f64;
            let mut steps = Vec::with_capacity(self.values.len() * 2 + 1);
            steps.push((self.x_min, 0.0));
            for (i, &v) in self.values.iter().enumerate() {
                steps.push((v, i as f64 / n));
                steps.push((v, (i + 1) as f64 / n));
            }
            chart
                .draw_series(LineSeries::new(steps, ENCODED.stroke_width(2)))
                .map_err(err)?
                .label("CDF")
                .legend(legend_mark(ENCODED, 3));
            if let Some((g, label)) = self.guide {
                chart
                    .draw_series(LineSeries::new(
                        vec![(g, 0.0), (g, 1.0)],
                        GUIDE.stroke_width(1),
                    ))
                    .map_err(err)?
                    .label(label)
                    .legend(legend_mark(GUIDE, 2));
            }
            draw_legend(&mut chart, SeriesLabelPosition::LowerRight)
        }
    }
}
