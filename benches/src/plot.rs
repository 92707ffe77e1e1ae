//! The plot of each scenario, as SVG through `plotters` (SVG backend only, no font files: the
//! text is left to the viewer). A figure is panels stacked vertically; a panel is either
//! horizontal bars (one per measured variant, labelled on the left, so long names stay
//! readable) or lines (a series per design over a swept parameter or over time).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// The palette, in the order series and bar groups use it.
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// One bar: its label, its value and its color group (bars of one group share a color).
#[derive(Debug, Clone)]
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub group: usize,
}

impl Bar {
    pub fn new(label: impl Into<String>, value: f64, group: usize) -> Self {
        Bar {
            label: label.into(),
            value,
            group,
        }
    }
}

/// One panel of a figure.
#[derive(Debug, Clone)]
pub enum Panel {
    /// Horizontal bars; `log` puts the value axis on a log scale.
    Bars {
        title: String,
        unit: String,
        log: bool,
        bars: Vec<Bar>,
    },
    /// Lines, one per named series of `(x, y)` points.
    Lines {
        title: String,
        x_label: String,
        y_label: String,
        log_y: bool,
        series: Vec<(String, Vec<(f64, f64)>)>,
    },
}

/// A titled stack of panels.
#[derive(Debug, Clone)]
pub struct Figure {
    pub title: String,
    pub panels: Vec<Panel>,
}

const WIDTH: u32 = 960;

impl Figure {
    pub fn new(title: impl Into<String>) -> Self {
        Figure {
            title: title.into(),
            panels: Vec::new(),
        }
    }

    pub fn panel(mut self, panel: Panel) -> Self {
        self.panels.push(panel);
        self
    }

    /// Writes the figure to `path` as SVG.
    pub fn draw(&self, path: &Path) -> anyhow::Result<()> {
        let heights: Vec<u32> = self
            .panels
            .iter()
            .map(|p| match p {
                Panel::Bars { bars, .. } => 90 + 26 * bars.len().max(1) as u32,
                Panel::Lines { .. } => 380,
            })
            .collect();
        let total = 40 + heights.iter().sum::<u32>();
        let root = SVGBackend::new(path, (WIDTH, total)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let (head, mut rest) = root.split_vertically(40);
        head.draw(&Text::new(
            self.title.clone(),
            (12, 10),
            ("sans-serif", 20).into_font(),
        ))
        .map_err(plot_error)?;
        for (panel, height) in self.panels.iter().zip(heights) {
            let (area, below) = rest.split_vertically(height);
            rest = below;
            match panel {
                Panel::Bars {
                    title,
                    unit,
                    log,
                    bars,
                } => draw_bars(&area, title, unit, *log, bars)?,
                Panel::Lines {
                    title,
                    x_label,
                    y_label,
                    log_y,
                    series,
                } => draw_lines(&area, title, x_label, y_label, *log_y, series)?,
            }
        }
        root.present().map_err(plot_error)?;
        Ok(())
    }
}

fn plot_error<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plotting failed: {e:?}")
}

fn draw_bars(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    unit: &str,
    log: bool,
    bars: &[Bar],
) -> anyhow::Result<()> {
    let n = bars.len().max(1);
    let max = bars
        .iter()
        .map(|b| b.value)
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let label_width = bars
        .iter()
        .map(|b| b.label.len())
        .max()
        .unwrap_or(8)
        .clamp(8, 48) as u32
        * 7
        + 12;
    // The first bar is drawn at the top: segment n - 1 - i.
    let labels: Vec<String> = bars.iter().rev().map(|b| b.label.clone()).collect();
    let name_of = move |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
            labels.get(*i).cloned().unwrap_or_default()
        }
        SegmentValue::Last => String::new(),
    };
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .margin_right(60)
        .x_label_area_size(36)
        .y_label_area_size(label_width);
    let y_range = (0..n).into_segmented();
    if log {
        let min = bars
            .iter()
            .map(|b| b.value)
            .filter(|v| *v > 0.0)
            .fold(f64::INFINITY, f64::min)
            .min(max);
        let low = 10f64.powf(min.log10().floor());
        let high = 10f64.powf((max.log10() + 0.05).ceil());
        let mut chart = builder
            .build_cartesian_2d((low..high).log_scale(), y_range)
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&name_of)
            .x_desc(format!("{unit} (log scale)"))
            .draw()
            .map_err(plot_error)?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, b)| {
                let color = COLORS[b.group % COLORS.len()];
                let i = n - 1 - i;
                let mut bar = Rectangle::new(
                    [
                        (low, SegmentValue::Exact(i)),
                        (b.value.max(low), SegmentValue::Exact(i + 1)),
                    ],
                    color.filled(),
                );
                bar.set_margin(3, 3, 0, 0);
                bar
            }))
            .map_err(plot_error)?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, b)| {
                Text::new(
                    format!(" {}", short_number(b.value)),
                    (b.value.max(low), SegmentValue::CenterOf(n - 1 - i)),
                    TextStyle::from(("sans-serif", 11).into_font())
                        .pos(Pos::new(HPos::Left, VPos::Center)),
                )
            }))
            .map_err(plot_error)?;
    } else {
        let mut chart = builder
            .build_cartesian_2d(0.0..max * 1.08, y_range)
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&name_of)
            .x_desc(unit)
            .draw()
            .map_err(plot_error)?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, b)| {
                let color = COLORS[b.group % COLORS.len()];
                let i = n - 1 - i;
                let mut bar = Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(i)),
                        (b.value, SegmentValue::Exact(i + 1)),
                    ],
                    color.filled(),
                );
                bar.set_margin(3, 3, 0, 0);
                bar
            }))
            .map_err(plot_error)?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, b)| {
                Text::new(
                    format!(" {}", short_number(b.value)),
                    (b.value, SegmentValue::CenterOf(n - 1 - i)),
                    TextStyle::from(("sans-serif", 11).into_font())
                        .pos(Pos::new(HPos::Left, VPos::Center)),
                )
            }))
            .map_err(plot_error)?;
    }
    Ok(())
}

/// Three significant digits, with a thousands separator above 1,000: `0.412`, `9.81`, `12,400`.
fn short_number(v: f64) -> String {
    if v >= 1000.0 {
        crate::report::count(v)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn draw_lines(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    x_label: &str,
    y_label: &str,
    log_y: bool,
    series: &[(String, Vec<(f64, f64)>)],
) -> anyhow::Result<()> {
    let points = || series.iter().flat_map(|(_, pts)| pts.iter().copied());
    let x_min = points().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let x_max = points().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    let y_max = points().map(|p| p.1).fold(0.0_f64, f64::max).max(1e-9);
    let (x_min, x_max) = if x_min.is_finite() && x_max > x_min {
        (x_min, x_max)
    } else {
        (0.0, 1.0)
    };
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70);
    macro_rules! finish {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_label)
                .y_desc(y_label)
                .draw()
                .map_err(plot_error)?;
            for (i, (name, pts)) in series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                    .map_err(plot_error)?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                // Markers only where there are few points: a time series reads better as a line.
                if pts.len() <= 30 {
                    chart
                        .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
                        .map_err(plot_error)?;
                }
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(plot_error)?;
        }};
    }
    if log_y {
        let y_min = points()
            .map(|p| p.1)
            .filter(|v| *v > 0.0)
            .fold(f64::INFINITY, f64::min)
            .min(y_max);
        let low = 10f64.powf(y_min.log10().floor());
        let high = 10f64.powf((y_max.log10() + 0.05).ceil());
        finish!(
            builder
                .build_cartesian_2d(x_min..x_max, (low..high).log_scale())
                .map_err(plot_error)?
        );
    } else {
        finish!(
            builder
                .build_cartesian_2d(x_min..x_max, 0.0..y_max * 1.1)
                .map_err(plot_error)?
        );
    }
    Ok(())
}
