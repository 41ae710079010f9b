//! The agent's config file.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use monky_deployd::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = Config::parse(text, Path::new("fuzz.yaml")) {
        // An accepted config names an env the agent can use as a directory and project name.
        assert!(!cfg.env_id.is_empty());
        assert!(
            cfg.env_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        );
        assert!(cfg.tenancy_url().is_ok() && cfg.bao_url().is_ok());
    }
});
