//! Leak reports (`--features log`): a pool whose last handle drops while blocks are still alive
//! logs one warning through the `log` facade, with their number, bytes and labels; a pool that
//! drops clean logs nothing.

use std::sync::Mutex;

use vkgdr::chunk::HostMemorySource;
use vkgdr::{Pool, PoolConfig};

/// Every record logged, as (level, target, message).
static RECORDS: Mutex<Vec<(log::Level, String, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        RECORDS.lock().unwrap().push((
            record.level(),
            record.target().to_string(),
            record.args().to_string(),
        ));
    }
    fn flush(&self) {}
}

fn taken() -> Vec<(log::Level, String, String)> {
    std::mem::take(&mut *RECORDS.lock().unwrap())
}

#[test]
fn dropping_a_pool_with_live_blocks_logs_a_warning() {
    log::set_logger(&Capture).unwrap();
    log::set_max_level(log::LevelFilter::Trace);
    let config = PoolConfig {
        shards: 2,
        dedicated_threshold: 64 << 10,
        ..Default::default()
    };

    // Clean: nothing alive, nothing logged.
    let pool = Pool::new(HostMemorySource, config.clone()).unwrap();
    drop(pool.alloc_labeled(100, 16, "gone").unwrap());
    drop(pool);
    assert_eq!(taken(), []);

    // Three blocks outlive the pool: one warning naming them.
    let pool = Pool::new(HostMemorySource, config).unwrap();
    let a = pool.alloc_labeled(100, 16, "gains").unwrap();
    let b = pool.alloc_labeled(200, 16, "gains").unwrap();
    let c = pool.alloc(128 << 10, 64).unwrap();
    drop(pool);
    let records = taken();
    assert_eq!(records.len(), 1, "{records:?}");
    let (level, target, message) = &records[0];
    assert_eq!((*level, target.as_str()), (log::Level::Warn, "vkgdr::pool"));
    for needle in ["3 blocks still alive", "\"gains\": 2 blocks, 300 B"] {
        assert!(message.contains(needle), "{needle:?} missing: {message}");
    }
    // The blocks still work and free their memory afterwards, silently.
    drop((a, b, c));
    assert_eq!(taken(), []);
}
