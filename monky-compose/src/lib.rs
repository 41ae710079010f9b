//! The docker compose driver and Engine API reader: the only crate of monky-deployd that
//! spawns processes or talks to the docker engine.
//!
//! - [`Docker`] is the driver, built with the agent's own `DOCKER_CONFIG`
//!   ([`DockerBuilder::docker_config`]). It finds compose v2 (the `docker compose` plugin, or a
//!   `docker-compose` v2 binary run standalone; compose v1 is refused), reports
//!   [`DockerFacts`], prunes images, and reads container states.
//! - [`Compose`] drives one project: [`Compose::pull`] (failures carry the registry's own
//!   message), [`Compose::up`] with a health wait, [`Compose::ps`], [`Compose::logs_tail`],
//!   [`Compose::down`], [`Compose::config_json`].
//! - [`Engine`] reads the Engine API over the unix socket in-process, so a heartbeat spawns no
//!   process; the CLI is the fallback only when the socket cannot be reached.
//! - [`process::Runner`] is the one process wrapper: explicit program, arguments, working
//!   directory and a minimal environment; a timeout that kills the process group; output
//!   captured up to a cap. Secrets never travel in arguments or the environment, only in the
//!   `--env-file` the caller wrote.
//! - Feature `testkit`: the recording stub `docker` and a fake Engine API socket for tests.
//!
//! ```
//! use monky_compose::{parse_ps_json, ComposeVersion};
//!
//! // compose before 2.21 prints one JSON array, later versions one object per line
//! let old = r#"[{"Name":"p-web-1","Service":"web","State":"running","Health":"healthy"}]"#;
//! let new = "{\"Name\":\"p-web-1\",\"Service\":\"web\",\"State\":\"running\",\"Health\":\"healthy\"}\n";
//! assert_eq!(parse_ps_json(old).unwrap(), parse_ps_json(new).unwrap());
//! assert!(parse_ps_json(old).unwrap()[0].is_ready());
//!
//! let v = ComposeVersion::from_version_output("Docker Compose version v2.20.2").unwrap();
//! assert!(v >= ComposeVersion::WAIT_TIMEOUT && v < ComposeVersion::PS_JSON_LINES);
//! ```
#![deny(missing_docs)]

mod compose;
mod container;
mod docker;
pub mod engine;
mod error;
pub mod process;
#[cfg(feature = "testkit")]
pub mod testkit;
mod version;

pub use compose::{Compose, parse_ps_json, pull_failure_message};
pub use container::Container;
pub use docker::{
    CommandLimits, ComposeInfo, Docker, DockerBuilder, DockerFacts, FileStamp, SYSTEM_PLUGIN_DIRS,
};
pub use engine::{
    ContainerDetail, ContainerEvent, ContainerFacts, Engine, EngineInfo, NamedObject, ObjectKind,
    Probe, Running, TopProcess,
};
pub use error::{Error, ErrorKind, Result};
pub use version::ComposeVersion;
