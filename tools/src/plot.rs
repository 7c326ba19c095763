//! The SVG charts of `rolex bench --plot` and `rolex te-bench --sweep
//! --plot`, drawn with `plotters`' SVG backend (text is written as SVG
//! `<text>`, so no font library is needed to draw or to view them).
//!
//! The charts only draw what the benchmarks measured: every series here is
//! one of the run's own figures, unscaled and unsmoothed. Empty series are
//! left out (and so is a panel with nothing to show, which says so), never
//! drawn as a flat line at zero.

use std::fmt;
use std::path::{Path, PathBuf};

use plotters::chart::SeriesAnno;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One operation kind's latency distribution.
pub struct Cdf {
    /// The kind, as the legend names it.
    pub name: &'static str,
    /// Operations of this kind.
    pub ops: u64,
    /// `(latency in µs, fraction of the kind's operations at or below it)`,
    /// increasing in both.
    pub points: Vec<(f64, f64)>,
}

/// Operations completed in one interval of a run.
pub struct Bucket {
    /// Start and end of the interval, in seconds since the run began.
    pub start_s: f64,
    /// End of the interval (the run's end for the last one).
    pub end_s: f64,
    /// Operations that completed in it.
    pub ops: u64,
}

/// One size of a transfer-engine sweep.
pub struct SweepPoint {
    /// Bytes per operation.
    pub size: u64,
    /// The engine's bandwidth, Gbit/s.
    pub gbps: f64,
    /// Median latency of one operation alone, µs.
    pub p50_us: f64,
    /// memcpy of the same size in the same run, Gbit/s (`None` across
    /// processes, where there is no local reference).
    pub memcpy_gbps: Option<f64>,
}

/// A chart that could not be drawn or written.
#[derive(Debug)]
pub struct PlotError {
    /// The file being drawn.
    pub path: PathBuf,
    /// What `plotters` reported.
    pub error: String,
}

impl fmt::Display for PlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "drawing {}: {}", self.path.display(), self.error)
    }
}

impl std::error::Error for PlotError {}

/// Creates (or empties) `path`, so a run whose chart could not be written
/// fails before it measures anything rather than after.
pub fn create(path: &Path) -> Result<(), PlotError> {
    std::fs::File::create(path)
        .map(drop)
        .map_err(|e| PlotError {
            path: path.to_owned(),
            error: e.to_string(),
        })
}

/// Chart width and height in pixels (two panels side by side).
const SIZE: (u32, u32) = (1280, 520);
const FONT: &str = "sans-serif";
/// Distinct series colours (the Tableau 10 palette's first six).
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Draws `title`'s two panels into `path`: `left` and `right` each get one
/// half of the area below the title.
fn two_panels(
    path: &Path,
    title: &str,
    left: impl FnOnce(&Area) -> DrawResult,
    right: impl FnOnce(&Area) -> DrawResult,
) -> Result<(), PlotError> {
    let draw = || -> DrawResult {
        let root = SVGBackend::new(path, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let body = root.titled(title, (FONT, 22))?;
        let (l, r) = body.split_horizontally(SIZE.0 / 2);
        left(&l)?;
        right(&r)?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| PlotError {
        path: path.to_owned(),
        error: e.to_string(),
    })
}

/// A panel with a caption and a note instead of a chart.
fn empty_panel(area: &Area, caption: &str, note: &str) -> DrawResult {
    let (w, h) = area.dim_in_pixel();
    let centred = |size: u32, v: VPos| {
        TextStyle::from((FONT, size).into_font()).pos(Pos::new(HPos::Center, v))
    };
    area.draw(&Text::new(
        caption.to_string(),
        (w as i32 / 2, 20),
        centred(18, VPos::Top),
    ))?;
    area.draw(&Text::new(
        note.to_string(),
        (w as i32 / 2, h as i32 / 2),
        centred(15, VPos::Center).color(&BLACK.mix(0.6)),
    ))?;
    Ok(())
}

/// `(lo, hi)` of the positive `values`, widened by the factor `pad`;
/// `None` if there is none. With `decades`, widened further to whole
/// powers of ten: `plotters` labels a log axis from the first power of ten
/// inside it, so a range like 14..450 would leave everything below 100
/// unlabelled.
fn log_range(values: impl Iterator<Item = f64>, pad: f64, decades: bool) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    (hi > 0.0).then(|| {
        let (mut lo, mut hi) = (lo / pad, hi * pad);
        if decades {
            // A hair beyond the power of ten, so rounding in `plotters`
            // does not drop the label at either end.
            lo = 10f64.powf(lo.log10().floor()) * 0.999;
            hi = 10f64.powf(hi.log10().ceil()) * 1.001;
        }
        // One decade at least, so a single point is not a degenerate axis.
        if hi / lo < 10.0 {
            let mid = (lo * hi).sqrt();
            (mid / 10f64.sqrt(), mid * 10f64.sqrt())
        } else {
            (lo, hi)
        }
    })
}

/// A number as an axis label: at most 3 significant digits, SI suffix for
/// thousands and millions.
fn si(v: f64) -> String {
    let a = v.abs();
    let (x, suffix) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let digits = if x.abs() >= 100.0 || x == x.round() {
        0
    } else if x.abs() >= 10.0 {
        1
    } else if x.abs() >= 1.0 {
        2
    } else {
        3
    };
    let s = format!("{x:.digits$}");
    // "2.50" → "2.5", "1.00" stays "1" via the `x == round` case above.
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    format!("{s}{suffix}")
}

/// Bytes as a size label: `64 B`, `16 KiB`, `4 MiB`.
pub fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// Adds `name`'s legend entry to the series just drawn.
fn legend<DB: DrawingBackend>(anno: &mut SeriesAnno<'_, DB>, name: String, color: RGBColor) {
    anno.label(name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(3)));
}

/// `rolex bench --plot`: latency CDF per operation kind (left) and
/// throughput per interval of `interval_s` seconds over the run (right).
pub fn bench(
    path: &Path,
    title: &str,
    cdfs: &[Cdf],
    buckets: &[Bucket],
    interval_s: f64,
) -> Result<(), PlotError> {
    two_panels(
        path,
        title,
        |area| latency_cdf(area, cdfs),
        |area| throughput(area, buckets, interval_s),
    )
}

fn latency_cdf(area: &Area, cdfs: &[Cdf]) -> DrawResult {
    const CAPTION: &str = "latency CDF per operation kind";
    let cdfs: Vec<&Cdf> = cdfs.iter().filter(|c| !c.points.is_empty()).collect();
    let Some((lo, hi)) = log_range(
        cdfs.iter().flat_map(|c| c.points.iter().map(|p| p.0)),
        1.1,
        true,
    ) else {
        return empty_panel(area, CAPTION, "no operation completed");
    };
    let mut chart = ChartBuilder::on(area)
        .caption(CAPTION, (FONT, 18))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(58)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..1.0)?;
    chart
        .configure_mesh()
        .x_desc("latency (µs, log scale)")
        .y_desc("fraction of operations ≤ latency")
        .x_label_formatter(&|v| si(*v))
        .y_label_formatter(&|v| format!("{v:.1}"))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .draw()?;
    for (i, c) in cdfs.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let anno = chart.draw_series(LineSeries::new(
            c.points.iter().copied(),
            color.stroke_width(2),
        ))?;
        legend(anno, format!("{} ({} ops)", c.name, c.ops), color);
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 14))
        .draw()?;
    Ok(())
}

fn throughput(area: &Area, buckets: &[Bucket], interval_s: f64) -> DrawResult {
    const CAPTION: &str = "throughput over the run";
    let rate = |b: &Bucket| b.ops as f64 / (b.end_s - b.start_s).max(1e-9);
    let end = buckets.last().map_or(0.0, |b| b.end_s);
    if buckets.is_empty() || end <= 0.0 {
        return empty_panel(area, CAPTION, "no operation completed");
    }
    let top = buckets.iter().map(rate).fold(0f64, f64::max).max(1.0) * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(CAPTION, (FONT, 18))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(58)
        .build_cartesian_2d(0f64..end, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("time since the run began (s)")
        .y_desc("operations per second")
        .x_label_formatter(&|v| si(*v))
        .y_label_formatter(&|v| si(*v))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .draw()?;
    // A step line: each interval's rate held over the interval.
    let steps = buckets
        .iter()
        .flat_map(|b| [(b.start_s, rate(b)), (b.end_s, rate(b))]);
    let color = PALETTE[0];
    let anno = chart.draw_series(LineSeries::new(steps, color.stroke_width(2)))?;
    let total: u64 = buckets.iter().map(|b| b.ops).sum();
    legend(
        anno,
        format!("all operations ({total}), per {:.0} ms", interval_s * 1e3),
        color,
    );
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 14))
        .draw()?;
    Ok(())
}

/// `rolex te-bench --sweep --plot`: bandwidth (left) and median latency
/// (right) against the size, both log-log; memcpy of the same sizes beside
/// the bandwidth.
pub fn sweep(path: &Path, title: &str, op: &str, points: &[SweepPoint]) -> Result<(), PlotError> {
    two_panels(
        path,
        title,
        |area| {
            sweep_panel(
                area,
                "bandwidth against size",
                "bandwidth (Gbit/s, log scale)",
                op,
                points,
                true,
            )
        },
        |area| {
            sweep_panel(
                area,
                "latency against size",
                "p50 latency (µs, log scale)",
                op,
                points,
                false,
            )
        },
    )
}

fn sweep_panel(
    area: &Area,
    caption: &str,
    y_desc: &str,
    op: &str,
    points: &[SweepPoint],
    bandwidth: bool,
) -> DrawResult {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    if bandwidth {
        series.push((
            format!("te-bench {op}"),
            points.iter().map(|p| (p.size as f64, p.gbps)).collect(),
        ));
        let memcpy: Vec<(f64, f64)> = points
            .iter()
            .filter_map(|p| Some((p.size as f64, p.memcpy_gbps?)))
            .collect();
        if !memcpy.is_empty() {
            series.push(("memcpy, same sizes".into(), memcpy));
        }
    } else {
        series.push((
            format!("te-bench {op}, one at a time"),
            points.iter().map(|p| (p.size as f64, p.p50_us)).collect(),
        ));
    }
    // Log axes: a non-positive figure has no place on them.
    for (_, s) in &mut series {
        s.retain(|p| p.1.is_finite() && p.1 > 0.0);
    }
    series.retain(|(_, s)| !s.is_empty());
    let sizes: Vec<f64> = points.iter().map(|p| p.size as f64).collect();
    let (Some((xlo, xhi)), Some((ylo, yhi))) = (
        log_range(sizes.iter().copied(), 1.4, false),
        log_range(
            series.iter().flat_map(|(_, s)| s.iter().map(|p| p.1)),
            1.1,
            true,
        ),
    ) else {
        return empty_panel(area, caption, "no size measured");
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 18))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(58)
        .build_cartesian_2d(
            (xlo..xhi).log_scale().with_key_points(sizes.clone()),
            (ylo..yhi).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("bytes per operation (log scale)")
        .y_desc(y_desc)
        .x_label_formatter(&|v| bytes(v.round() as u64))
        .y_label_formatter(&|v| si(*v))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .draw()?;
    for (i, (name, s)) in series.into_iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let anno = chart.draw_series(LineSeries::new(s, color.stroke_width(2)).point_size(3))?;
        legend(anno, name, color);
    }
    chart
        .configure_series_labels()
        .position(if bandwidth {
            SeriesLabelPosition::LowerRight
        } else {
            SeriesLabelPosition::UpperLeft
        })
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 14))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(si(0.5), "0.5");
        assert_eq!(si(1.0), "1");
        assert_eq!(si(12.5), "12.5");
        assert_eq!(si(2500.0), "2.5k");
        assert_eq!(si(1_000_000.0), "1M");
        assert_eq!(si(0.123), "0.123");
        assert_eq!(bytes(64), "64 B");
        assert_eq!(bytes(4096), "4 KiB");
        assert_eq!(bytes(4 << 20), "4 MiB");
        assert_eq!(bytes(1500), "1500 B");
    }

    #[test]
    fn log_ranges_span_a_decade_and_skip_non_positive() {
        assert_eq!(
            log_range([0.0, -1.0, f64::NAN].into_iter(), 1.5, false),
            None
        );
        let (lo, hi) = log_range([5.0].into_iter(), 1.5, false).unwrap();
        assert!(lo < 5.0 && hi > 5.0 && hi / lo >= 9.99, "{lo} {hi}");
        let (lo, hi) = log_range([1.0, 1000.0].into_iter(), 2.0, false).unwrap();
        assert!((lo - 0.5).abs() < 1e-9 && (hi - 2000.0).abs() < 1e-9);
        let (lo, hi) = log_range([14.0, 450.0, 0.0].into_iter(), 1.1, true).unwrap();
        assert!(
            (lo - 10.0).abs() < 0.1 && (hi - 1000.0).abs() < 1.1,
            "{lo} {hi}"
        );
    }
}
