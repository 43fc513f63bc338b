//! A job's timeline as an SVG chart: its workers (a step line, left axis) and its speed
//! (samples/s, right axis) over the minutes since its first point, each plan the brain made
//! marked by a vertical line.

use plotters::prelude::*;

use crate::store::TimelinePoint;

/// The chart of `points` (oldest first) with plans made at `plans_unix_ms`; a short text in
/// place of a chart while there are fewer than two points.
pub fn timeline_svg(points: &[TimelinePoint], plans_unix_ms: &[i64]) -> String {
    let mut svg = String::new();
    if points.len() < 2 {
        return svg;
    }
    if let Err(e) = draw(&mut svg, points, plans_unix_ms) {
        tracing::warn!("the timeline chart failed: {e}");
        return String::new();
    }
    svg
}

fn draw(
    svg: &mut String,
    points: &[TimelinePoint],
    plans_unix_ms: &[i64],
) -> Result<(), Box<dyn std::error::Error>> {
    let t0 = points[0].at_unix_ms;
    let minutes = |ms: i64| (ms - t0) as f64 / 60_000.0;
    let x_max = minutes(points[points.len() - 1].at_unix_ms).max(0.1);
    let w_max = points.iter().map(|p| p.workers).max().unwrap_or(1).max(1) as f64 + 1.0;
    let s_max = points
        .iter()
        .map(|p| p.samples_per_second)
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.1;
    let root = SVGBackend::with_string(svg, (760, 280)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .right_y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..w_max)?
        .set_secondary_coord(0.0..x_max, 0.0..s_max);
    chart
        .configure_mesh()
        .x_desc("minutes")
        .y_desc("workers")
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc("samples/s")
        .draw()?;
    for &at in plans_unix_ms.iter().filter(|&&at| at >= t0) {
        let x = minutes(at).min(x_max);
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(x, 0.0), (x, w_max)],
            RGBColor(200, 120, 0).stroke_width(1),
        )))?;
    }
    // Workers hold their count until the next point: a step line.
    let mut steps = Vec::with_capacity(points.len() * 2);
    for pair in points.windows(2) {
        steps.push((minutes(pair[0].at_unix_ms), pair[0].workers as f64));
        steps.push((minutes(pair[1].at_unix_ms), pair[0].workers as f64));
    }
    let last = &points[points.len() - 1];
    steps.push((minutes(last.at_unix_ms), last.workers as f64));
    chart
        .draw_series(LineSeries::new(steps, BLUE.stroke_width(2)))?
        .label("workers")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLUE));
    chart
        .draw_secondary_series(LineSeries::new(
            points
                .iter()
                .map(|p| (minutes(p.at_unix_ms), p.samples_per_second)),
            GREEN.stroke_width(2),
        ))?
        .label("samples/s")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], GREEN));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_draws_sizes_speed_and_plans_once_there_are_two_points() {
        let p = |s: i64, workers: u32, sps: f64| TimelinePoint {
            at_unix_ms: 1_700_000_000_000 + s * 1000,
            workers,
            ps: 0,
            samples_per_second: sps,
        };
        assert_eq!(timeline_svg(&[p(0, 2, 10.0)], &[]), "");
        let svg = timeline_svg(
            &[p(0, 2, 10.0), p(60, 4, 20.0), p(120, 4, 21.0)],
            &[1_700_000_000_000 + 55_000],
        );
        assert!(svg.starts_with("<svg"), "{svg}");
        for word in ["workers", "samples/s", "minutes"] {
            assert!(svg.contains(word), "{word} missing");
        }
    }
}
