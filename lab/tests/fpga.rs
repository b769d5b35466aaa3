//! `lab run fpga --quick` end to end: the design verilated, simulated on odd widths and hostile
//! values at two lane counts, every record passing its three checks. Needs Verilator.

use lab::record::{read_records, Verdict};
use std::process::Command;

#[test]
fn the_quick_fpga_sweep_passes_all_three_checks() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_lab"))
        .args(["run", "fpga", "--quick", "--backend", "cpu", "--seed", "3", "--out", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let (records, damage) = read_records(dir.path()).unwrap();
    assert!(damage.is_empty(), "{damage:?}");
    assert!(records.iter().any(|r| r.params["fill"] == "hostile") && records.iter().any(|r| r.params["n"] == 17));
    for r in &records {
        let checks = &r.extra["checks"];
        for check in ["bit_exact", "cycles", "f64"] {
            assert_eq!(checks[check]["passed"], true, "{check} {}: {checks}", r.params);
        }
        assert_eq!(checks["cycles"]["simulated"], checks["cycles"]["analytic"], "{}", r.params);
        assert_eq!((r.verdict, r.provider.as_str()), (Verdict::Pass, "verilator"));
        // A timed figure is modelled from cycles at the stated clock, and says so.
        if let Some(t) = &r.time_ms {
            let cycles = r.extra["cycles"].as_f64().unwrap();
            let expected_ms = cycles / (r.extra["clock_mhz"].as_f64().unwrap() * 1e3);
            assert!((t.median - expected_ms).abs() <= 1e-12 * expected_ms, "{} against {expected_ms}", t.median);
            assert_eq!(r.timing.as_ref().unwrap().launch, "simulated");
        }
    }
}
