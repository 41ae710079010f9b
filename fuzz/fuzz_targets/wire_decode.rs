//! Tenancy's answers as the agent decodes them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use monky_agent_proto::{
    CheckinResponse, ErrorEnvelope, LeaseResponse, ReportRequest, is_retired_lease_shape,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = serde_json::from_slice::<CheckinResponse>(data) {
        let again: CheckinResponse =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(again, r);
    }
    let _ = serde_json::from_slice::<LeaseResponse>(data);
    if let Ok(e) = serde_json::from_slice::<ErrorEnvelope>(data) {
        let again: ErrorEnvelope =
            serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
        assert_eq!(again, e);
    }
    let _ = serde_json::from_slice::<ReportRequest>(data);
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = is_retired_lease_shape(&v);
    }
});
