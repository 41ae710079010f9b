//! monky-deployd's integration tests: the real binary against the testkit peers and a stub
//! docker (in `e2e`, the real docker engine and a registry), one module per concern.

mod util;

mod alerts;
mod apply;
mod boxfiles;
mod budget;
mod bundle_check;
mod channel;
mod cli;
mod clock;
mod crash;
mod crypto;
mod deadline;
mod disk;
mod e2e;
mod faults;
mod heal;
mod hostile;
mod images;
mod leaks;
mod lifecycle;
mod observe;
mod operator;
mod outage;
mod packaging;
mod paths;
mod policy;
mod realbao;
mod redaction;
mod runbooks;
mod shapes;
mod soak;
mod token;
mod transport;
mod upgrade;
