//! The replay's SVG report (plotters, SVG backend: text is left to the viewer's fonts, so
//! nothing is needed on the machine that writes it). One row per tenant: tokens per minute
//! admitted and denied against the TPM limit, requests in flight against the concurrency limit,
//! budget used against its limit.

use std::path::Path;

use plotters::prelude::*;

use super::quota::Limits;
use super::Result;

/// Everything the report shows. Series are `(minutes of trace time, value)`.
pub struct Report {
    pub title: String,
    /// Lines under the title: how the replay ran, and how to read the charts.
    pub lines: Vec<String>,
    pub attribution: String,
    /// The x axis' end, in trace minutes.
    pub minutes: f64,
    pub tenants: Vec<TenantSeries>,
}

pub struct TenantSeries {
    pub name: String,
    /// How its limits were chosen, in words.
    pub plan: String,
    /// Requests, grants, denials by limit: one line each.
    pub lines: Vec<String>,
    pub limits: Limits,
    /// Real tokens of the requests admitted in the trailing trace minute.
    pub admitted_tpm: Vec<(f64, f64)>,
    /// Real tokens of the requests denied in the trailing trace minute.
    pub denied_tpm: Vec<(f64, f64)>,
    /// Most requests in flight within each sample step.
    pub in_flight: Vec<(f64, f64)>,
    /// Tokens settled so far.
    pub used: Vec<(f64, f64)>,
}

// Sized to stay legible when a README shows it scaled down to ~900 px wide.
const WIDTH: u32 = 1300;
const ROW: u32 = 250;
const HEADER: u32 = 104;
const FOOTER: u32 = 40;
const LABELS: u32 = 220;
const FONT: &str = "sans-serif";
const ADMITTED: RGBColor = RGBColor(31, 119, 180);
const DENIED: RGBColor = RGBColor(214, 39, 40);
// Opaque fills: a translucent blue over the red of the stacked area would turn grey.
const ADMITTED_FILL: RGBColor = RGBColor(166, 200, 228);
const DENIED_FILL: RGBColor = RGBColor(243, 160, 160);
const LIMIT: RGBColor = RGBColor(20, 20, 20);
const GRID: RGBColor = RGBColor(225, 225, 225);

/// Writes the report to `path` (its directory is created).
pub fn write_svg(path: &Path, report: &Report) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    draw(path, report)
        .map_err(|e| format!("cannot write the report {}: {e}", path.display()).into())
}

fn draw(path: &Path, report: &Report) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let rows = report.tenants.len().max(1) as u32;
    let height = HEADER + rows * ROW + FOOTER;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (header, rest) = root.split_vertically(HEADER);
    let (body, footer) = rest.split_vertically(rows * ROW);

    header.draw_text(
        &report.title,
        &(FONT, 28).into_font().color(&BLACK),
        (14, 10),
    )?;
    for (i, line) in report.lines.iter().enumerate() {
        header.draw_text(
            line,
            &(FONT, 16).into_font().color(&RGBColor(60, 60, 60)),
            (14, 50 + 24 * i as i32),
        )?;
    }
    footer.draw_text(
        &report.attribution,
        &(FONT, 16).into_font().color(&RGBColor(90, 90, 90)),
        (14, 12),
    )?;

    for (area, tenant) in body
        .split_evenly((rows as usize, 1))
        .iter()
        .zip(&report.tenants)
    {
        let (labels, charts) = area.split_horizontally(LABELS);
        draw_labels(&labels, tenant)?;
        let cells = charts.split_evenly((1, 3));
        let x = 0.0..report.minutes.max(1.0);
        let l = &tenant.limits;

        // Tokens per minute, admitted stacked under denied, against the TPM limit.
        let stacked: Vec<(f64, f64)> = tenant
            .admitted_tpm
            .iter()
            .zip(&tenant.denied_tpm)
            .map(|(a, d)| (a.0, a.1 + d.1))
            .collect();
        let top = headroom(max_of(&stacked).max(l.tpm as f64));
        let mut chart = new_chart(
            &cells[0],
            "tokens per minute",
            l.tpm,
            "TPM limit",
            x.clone(),
            top,
        )?;
        chart.draw_series(AreaSeries::new(stacked, 0.0, DENIED_FILL).border_style(DENIED))?;
        chart.draw_series(
            AreaSeries::new(tenant.admitted_tpm.iter().copied(), 0.0, ADMITTED_FILL)
                .border_style(ADMITTED),
        )?;
        limit_line(&mut chart, x.clone(), l.tpm)?;

        // Requests in flight against the concurrency limit.
        let top = headroom(max_of(&tenant.in_flight).max(l.concurrency as f64));
        let mut chart = new_chart(
            &cells[1],
            "requests in flight",
            l.concurrency,
            "concurrency limit",
            x.clone(),
            top,
        )?;
        chart.draw_series(
            AreaSeries::new(tenant.in_flight.iter().copied(), 0.0, ADMITTED_FILL)
                .border_style(ADMITTED),
        )?;
        limit_line(&mut chart, x.clone(), l.concurrency)?;

        // Budget used against its limit.
        let top = headroom(max_of(&tenant.used).max(l.budget as f64));
        let mut chart = new_chart(
            &cells[2],
            "budget used (tokens)",
            l.budget,
            "limit",
            x.clone(),
            top,
        )?;
        chart.draw_series(
            AreaSeries::new(tenant.used.iter().copied(), 0.0, ADMITTED_FILL)
                .border_style(ShapeStyle::from(ADMITTED).stroke_width(2)),
        )?;
        limit_line(&mut chart, x.clone(), l.budget)?;
    }
    root.present()?;
    Ok(())
}

type Chart<'a> = ChartContext<
    'a,
    SVGBackend<'a>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// A chart with its caption ("what — limit name N"), axes and grid.
fn new_chart<'a>(
    area: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    what: &str,
    limit: u64,
    limit_name: &str,
    x: std::ops::Range<f64>,
    top: f64,
) -> std::result::Result<Chart<'a>, Box<dyn std::error::Error>> {
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{what} — {limit_name} {}", short(limit as f64)),
            (FONT, 19),
        )
        .margin_top(4)
        .margin_right(26)
        .margin_bottom(2)
        .x_label_area_size(28)
        .y_label_area_size(58)
        .build_cartesian_2d(x, 0.0..top)?;
    chart
        .configure_mesh()
        .bold_line_style(GRID)
        .light_line_style(WHITE)
        .x_labels(7)
        .y_labels(5)
        .x_label_formatter(&|m| format!("{m:.0}"))
        .y_label_formatter(&|v| short(*v))
        .label_style((FONT, 16))
        .draw()?;
    Ok(chart)
}

fn limit_line(
    chart: &mut Chart<'_>,
    x: std::ops::Range<f64>,
    limit: u64,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let y = limit as f64;
    chart.draw_series(DashedLineSeries::new(
        [(x.start, y), (x.end, y)],
        8,
        5,
        ShapeStyle::from(LIMIT).stroke_width(2),
    ))?;
    Ok(())
}

fn draw_labels(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    tenant: &TenantSeries,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    area.draw_text(
        &tenant.name,
        &(FONT, 28).into_font().color(&BLACK),
        (14, 26),
    )?;
    // The plan, one clause a line (the column is narrow), then the counts.
    let plan = tenant.plan.split("; ").map(|l| (l, RGBColor(60, 60, 60)));
    let counts = tenant.lines.iter().map(|l| {
        let denied = l.starts_with("denied") && !l.ends_with("none");
        (
            l.as_str(),
            if denied { DENIED } else { RGBColor(30, 30, 30) },
        )
    });
    for (i, (line, color)) in plan.chain(counts).enumerate() {
        area.draw_text(
            line,
            &(FONT, 17).into_font().color(&color),
            (14, 64 + 22 * i as i32),
        )?;
    }
    Ok(())
}

fn max_of(series: &[(f64, f64)]) -> f64 {
    series.iter().map(|p| p.1).fold(0.0, f64::max)
}

/// Room above the highest value or limit, so the limit line is never on the frame.
fn headroom(top: f64) -> f64 {
    (top * 1.15).max(1.0)
}

/// 1234567 → "1.2M", 45000 → "45k", 12 → "12".
fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}
