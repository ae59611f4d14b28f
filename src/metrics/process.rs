//! The standard `process_*` metrics (as every Prometheus client library exports them, without the
//! koord_webhook prefix), read from /proc/self on each scrape. Elsewhere than Linux there are none.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Linux reports CPU times in clock ticks of USER_HZ, 100 on every architecture it runs on.
const TICKS_PER_SECOND: f64 = 100.0;

#[derive(Debug, Default)]
pub struct ProcessCollector;

#[derive(Debug, Default, PartialEq)]
struct Sample {
    cpu_seconds: f64,
    start_time_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    open_fds: f64,
}

/// Fields 14, 15 (utime, stime), 22 (starttime) and 23 (vsize) of /proc/self/stat, after the
/// command name (which may hold spaces, so the line is split after its last ')').
fn parse_stat(stat: &str, boot_time: f64, sample: &mut Sample) -> Option<()> {
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let number = |i: usize| fields.get(i)?.parse::<f64>().ok();
    sample.cpu_seconds = (number(11)? + number(12)?) / TICKS_PER_SECOND;
    sample.start_time_seconds = boot_time + number(19)? / TICKS_PER_SECOND;
    sample.virtual_bytes = number(20)?;
    Some(())
}

fn read() -> Option<Sample> {
    let mut sample = Sample::default();
    let boot_time = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())?;
    parse_stat(
        &std::fs::read_to_string("/proc/self/stat").ok()?,
        boot_time,
        &mut sample,
    )?;
    sample.resident_bytes = std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<f64>()
                .ok()
        })?
        * 1024.0;
    sample.open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
    Some(sample)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        for (name, help, value) in [
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                s.start_time_seconds,
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds,
            ),
        ] {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_times_and_sizes_from_a_stat_line() {
        // pid (comm with spaces) state ppid ... utime=250 stime=50 ... starttime=1000 vsize=4096
        let stat =
            "42 (koord webhook) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 1000 4096 300";
        let mut sample = Sample::default();
        parse_stat(stat, 1_700_000_000.0, &mut sample).unwrap();
        assert_eq!(sample.cpu_seconds, 3.0);
        assert_eq!(sample.start_time_seconds, 1_700_000_010.0);
        assert_eq!(sample.virtual_bytes, 4096.0);
        assert!(parse_stat("garbage", 0.0, &mut sample).is_none());
    }

    #[test]
    fn this_process_has_a_sample() {
        let sample = read().expect("/proc/self is readable on Linux");
        assert!(
            sample.resident_bytes > 0.0 && sample.open_fds > 0.0,
            "{sample:?}"
        );
    }
}
