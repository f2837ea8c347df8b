//! The `simulate` experiment: its JSON shape, counting at send resolution, each
//! algorithm's shape, and the table and SVG.

use super::{r, SEC};
use pushpace::limiter::{Algorithm, Nanos};
use pushpace::tools::simulate::{self, AlgorithmChoice, Format, SimulateArgs, Stall};

// ---------------------------------------------------------------------------------------
// simulate

fn args(stalls: &[&str]) -> SimulateArgs {
    SimulateArgs {
        stalls: stalls.iter().map(|s| s.parse().unwrap()).collect(),
        format: Format::Json,
        ..SimulateArgs::default()
    }
}

#[test]
fn simulate_json_has_the_documented_shape() {
    let out = simulate::run(&args(&["4s:1s", "6s:1s"])).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let obj = v.as_object().unwrap();
    let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    assert_eq!(v["rate"], serde_json::json!(1000));
    assert_eq!(v["items"], serde_json::json!(10000));
    assert_eq!(v["stalls"].as_array().unwrap().len(), 2);
    let algos = v["algorithms"].as_array().unwrap();
    let names: Vec<&str> = algos.iter().map(|a| a["name"].as_str().unwrap()).collect();
    let all: Vec<&str> = Algorithm::ALL.iter().map(|a| a.as_str()).collect();
    assert_eq!(names, all);
    for a in algos {
        let o = a.as_object().unwrap();
        let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "buckets_100ms",
                "finish_s",
                "max_100ms",
                "max_1s_window",
                "min_100ms",
                "name",
                "stddev_100ms"
            ]
        );
        let buckets: Vec<u64> = a["buckets_100ms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .collect();
        assert_eq!(buckets.iter().sum::<u64>(), 10_000, "{}", a["name"]);
        // The stalls [4 s, 5 s) and [6 s, 7 s) are empty buckets 40..50 and 60..70.
        assert!(
            buckets[40..50]
                .iter()
                .chain(&buckets[60..70])
                .all(|&b| b == 0),
            "{}",
            a["name"]
        );
        assert_eq!(a["min_100ms"], 0);
        assert_eq!(
            a["max_100ms"].as_u64().unwrap(),
            *buckets.iter().max().unwrap()
        );
        assert!(a["finish_s"].as_f64().unwrap() >= 11.0);
        assert!(a["stddev_100ms"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn simulate_counts_at_send_resolution() {
    // 500 sends at 0.5 s and 500 at 1.4 s: every window on bucket edges holds 500, the
    // window [0.5 s, 1.5 s) holds all 1000.
    let sends: Vec<Nanos> = std::iter::repeat_n(500_000_000, 500)
        .chain(std::iter::repeat_n(1_400_000_000, 500))
        .collect();
    let a = simulate::analyse("x", &sends);
    assert_eq!(a.max_1s_window, 1000);
    assert_eq!(a.buckets_100ms.len(), 15);
    assert_eq!(a.buckets_100ms[5], 500);
    assert_eq!(a.buckets_100ms[14], 500);
    assert_eq!((a.max_100ms, a.min_100ms), (500, 0));
    assert!((a.finish_s - 1.4).abs() < 1e-12);
    // Windows are half-open: sends exactly 1 s apart are not in one window.
    let a = simulate::analyse("y", &[0, 1_000_000_000]);
    assert_eq!(a.max_1s_window, 1);
}

#[test]
fn simulate_smooth_algorithms_pace_evenly_and_windows_front_load() {
    let report = simulate::simulate(&Algorithm::ALL, r(1000.0), 10_000, 0, &[]);
    for a in &report.algorithms {
        assert_eq!(a.buckets_100ms.iter().sum::<u64>(), 10_000);
        assert!(a.max_1s_window <= 1000, "{}: {}", a.name, a.max_1s_window);
        match a.name.as_str() {
            "gcra" | "leaky-bucket" | "token-bucket" | "governor" => {
                assert_eq!((a.max_100ms, a.min_100ms), (100, 100), "{}", a.name)
            }
            // The whole second's quota in the first 100 ms of each second.
            "fixed-window" | "sliding-log" => assert_eq!(a.max_100ms, 1000, "{}", a.name),
            "sliding-window" => assert_eq!(a.buckets_100ms[0], 1000),
            other => panic!("unexpected {other}"),
        }
    }
    // Deterministic: a second run is identical.
    assert_eq!(
        report,
        simulate::simulate(&Algorithm::ALL, r(1000.0), 10_000, 0, &[])
    );
}

#[test]
fn simulate_table_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("sim.svg");
    let args = SimulateArgs {
        algorithm: AlgorithmChoice::One(Algorithm::FixedWindow),
        items: 3000,
        stalls: vec![Stall {
            at: SEC,
            duration: SEC / 2,
        }],
        svg: Some(svg.clone()),
        ..SimulateArgs::default()
    };
    let out = simulate::run(&args).unwrap();
    assert!(out.contains("fixed-window"), "{out}");
    assert!(out.lines().count() > 3);
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.starts_with("<svg"), "not an SVG");
    assert!(drawn.contains("fixed-window"));

    let bad = SimulateArgs {
        rate: 0.0,
        ..SimulateArgs::default()
    };
    let err = simulate::run(&bad).unwrap_err().to_string();
    assert!(err.contains("greater than 0"), "{err}");
}
