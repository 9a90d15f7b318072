//! The replication benchmark's plots: plotters, bitmap backend, text through ab_glyph with a
//! TTF font found at run time, as `src/profile/plot.rs` does.

use super::*;

const SIZE: (u32, u32) = (1100, 650);
const COLORS: [RGBColor; 7] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(127, 127, 127),
];

type R = Result<(), String>;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn load_font() -> R {
    crate::plot_font::load_font()
}

/// An axis label without needless decimals.
fn short(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 || a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}").trim_end_matches(".0").to_string()
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn steps(sorted_v: &[f64], x0: f64) -> Vec<(f64, f64)> {
    let n = sorted_v.len() as f64;
    let mut s = Vec::with_capacity(sorted_v.len() * 2 + 1);
    s.push((x0, 0.0));
    // At most ~4,000 points: plenty for 1,100 pixels.
    let stride = (sorted_v.len() / 2000).max(1);
    for (i, &v) in sorted_v.iter().enumerate() {
        if i % stride == 0 || i + 1 == sorted_v.len() {
            s.push((v, i as f64 / n));
            s.push((v, (i + 1) as f64 / n));
        }
    }
    s
}

/// CDFs of `series` on one chart (x clipped at the largest p99.9 × 1.2 so tails show).
fn cdf_on<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    x_desc: &str,
    series: &[(String, Vec<f64>)],
    color_from: usize,
) -> R
where
    DB::ErrorType: 'static,
{
    let sorted_series: Vec<(String, Vec<f64>)> = series
        .iter()
        .map(|(l, v)| (l.clone(), sorted(v.clone())))
        .collect();
    let x_max = sorted_series
        .iter()
        .map(|(_, v)| pct(v, 0.999))
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max)
        * 1.2;
    let x_max = if x_max > 0.0 { x_max } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..100.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("CDF %")
        .x_label_formatter(&|v| short(*v))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .axis_desc_style(("sans-serif", 18))
        .label_style(("sans-serif", 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    for (i, (label, v)) in sorted_series.iter().enumerate() {
        let color = COLORS[(i + color_from) % COLORS.len()];
        let pts: Vec<(f64, f64)> = steps(v, 0.0)
            .into_iter()
            .map(|(x, y)| (x.min(x_max), y * 100.0))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(err)?
            .label(format!(
                "{label}: mean {:.2}, median {:.2}, p99.9 {:.2}",
                mean(v),
                pct(v, 0.5),
                pct(v, 0.999)
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)
}

/// Fig. 3: ping latency CDFs (unreplicated, replicated) beside the epoch-interval CDF.
pub fn ping_cdf(path: &Path, unrep: &[f64], rep: &[f64], interval: &[f64]) -> R {
    load_font()?;
    let root = BitMapBackend::new(path, (1600, 650)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let halves = root.split_evenly((1, 2));
    cdf_on(
        &halves[0],
        "UDP ping latency seen by the client",
        "latency (ms)",
        &[
            ("unreplicated".into(), unrep.to_vec()),
            ("replicated, 1 backup".into(), rep.to_vec()),
        ],
        0,
    )?;
    cdf_on(
        &halves[1],
        "Primary's epoch interval (same run)",
        "interval (ms)",
        &[("epoch interval".into(), interval.to_vec())],
        2,
    )?;
    root.present().map_err(err)
}

/// CDFs of several series in one chart.
pub fn cdfs(path: &Path, title: &str, x_desc: &str, series: &[(String, Vec<f64>)]) -> R {
    load_font()?;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    cdf_on(&root, title, x_desc, series, 0)?;
    root.present().map_err(err)
}

/// Figs. 4 and 5: latency percentiles, and mean checkpoint size, against the dirtying rate
/// (% of the link).
pub fn dirty(lat: &Path, size: &Path, cases: &[Value], link_mbs: f64, workload: &str) -> R {
    load_font()?;
    let x = |c: &Value| 100.0 * f(c, "rate_mbps") / link_mbs;
    let x_max = cases.iter().map(x).fold(0.0, f64::max).max(1.0) * 1.05;
    // Latency.
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for (label, side, k) in [
        ("replicated p50", "replicated", "p50"),
        ("replicated p99", "replicated", "p99"),
        ("replicated p99.9", "replicated", "p99_9"),
        ("unreplicated p99", "unreplicated", "p99"),
    ] {
        lines.push((
            label.into(),
            cases
                .iter()
                .map(|c| (x(c), f(&c[side]["latency_ms"], k)))
                .collect(),
        ));
    }
    xy(
        lat,
        &format!("Ping latency against the dirtying rate (1 backup; {workload})"),
        "dirtying rate (% of link bandwidth)",
        "latency (ms)",
        x_max,
        &lines,
    )?;
    let sizes = vec![
        (
            "raw: dirty pages x 4 KiB".to_string(),
            cases
                .iter()
                .map(|c| {
                    (
                        x(c),
                        f(&c["replicated"]["epochs"], "raw_bytes_mean") / 1024.0,
                    )
                })
                .collect::<Vec<_>>(),
        ),
        (
            "encoded (sent to the backup)".to_string(),
            cases
                .iter()
                .map(|c| {
                    (
                        x(c),
                        f(&c["replicated"]["epochs"], "encoded_bytes_mean") / 1024.0,
                    )
                })
                .collect(),
        ),
    ];
    xy(
        size,
        &format!("Mean checkpoint size against the dirtying rate ({workload})"),
        "dirtying rate (% of link bandwidth)",
        "KiB per checkpoint",
        x_max,
        &sizes,
    )
}

/// Lines of points; the y axis is logarithmic when the values span more than 50x.
fn xy(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    x_max: f64,
    lines: &[(String, Vec<(f64, f64)>)],
) -> R {
    let ys: Vec<f64> = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .filter(|v| v.is_finite())
        .collect();
    let y_max = ys.iter().copied().fold(0.0, f64::max).max(1e-3);
    let y_min = ys
        .iter()
        .copied()
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    if y_min.is_finite() && y_max / y_min > 50.0 {
        let floor = y_min / 2.0;
        xy_on(
            &root,
            title,
            x_desc,
            &format!("{y_desc}, log scale"),
            x_max,
            (floor..y_max * 2.0).log_scale(),
            floor,
            lines,
        )?;
    } else {
        xy_on(
            &root,
            title,
            x_desc,
            y_desc,
            x_max,
            0.0..y_max * 1.1,
            0.0,
            lines,
        )?;
    }
    root.present().map_err(err)
}

#[allow(clippy::too_many_arguments)]
fn xy_on<DB: DrawingBackend, Y>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    x_max: f64,
    y: Y,
    floor: f64,
    lines: &[(String, Vec<(f64, f64)>)],
) -> R
where
    DB::ErrorType: 'static,
    Y: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
    Y::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..x_max, y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|v| short(*v))
        .y_label_formatter(&|v| short(*v))
        .axis_desc_style(("sans-serif", 20))
        .label_style(("sans-serif", 16))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    for (i, (label, pts)) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = pts
            .iter()
            .copied()
            .filter(|p| p.1.is_finite())
            .map(|(x, y)| (x, y.max(floor)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
        .map_err(err)
}
