//! A checkin answer as the agent takes it: whatever tenancy sends, the decoded answer holds a
//! 64-hex sha and an interval inside its bounds, and no Retry-After value panics or waits past
//! an hour.
#![no_main]

use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;
use monky_agent_proto::client::{MAX_RETRY_AFTER, parse_retry_after};
use monky_agent_proto::{CheckinInterval, CheckinResponse, Sha};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = serde_json::from_slice::<CheckinResponse>(data) {
        if let Some(sha) = r.desired_sha() {
            assert_eq!(sha.as_str().len(), Sha::LEN);
            assert!(
                sha.as_str()
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
            assert!(sha.as_str().starts_with(sha.short()));
        }
        if let Some(interval) = r.checkin_interval_s {
            assert!((CheckinInterval::MIN..=CheckinInterval::MAX).contains(&interval.get()));
        }
        let again: CheckinResponse =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(again, r);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        // The sha parser agrees with its definition on any text.
        let hex =
            text.len() == Sha::LEN && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        assert_eq!(Sha::parse(text).is_ok(), hex);
        // Retry-After from any header text, at any clock reading.
        for now in [
            SystemTime::UNIX_EPOCH,
            SystemTime::now(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(u32::MAX.into()),
        ] {
            if let Some(wait) = parse_retry_after(text, now) {
                assert!(wait <= MAX_RETRY_AFTER);
            }
        }
    }
});
