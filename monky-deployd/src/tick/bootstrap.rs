//! `monky-deployd bootstrap`: the token from the kit's grant, outside a tick.

use monky_bao_client as bao;
use tracing::warn;

use super::{Run, TickOptions};
use crate::config::Config;
use crate::exit::Exit;
use crate::layout::Layout;
use crate::redact;

/// `monky-deployd bootstrap [--force]`: log in with the kit's grant and store the token.
pub(crate) fn bootstrap_command(cfg: &Config, force: bool) -> anyhow::Result<Exit> {
    let layout = Layout::open(cfg)?;
    let Some(_lock) = layout.lock()? else {
        anyhow::bail!("a tick is running; try again in a minute");
    };
    let (state, _) = crate::statefile::load(&layout)?;
    let mut run = Run::new(cfg, layout, state, TickOptions::default())?;
    if run.token_path().exists() && !force {
        outln!("a token is already stored; use --force to replace it");
        return Ok(Exit::Ok);
    }
    if force {
        // The old token stays valid until revoked by the new login's install_token.
        if let Ok(Some(text)) = run.read_token() {
            redact::register(text.trim());
            run.tick.token = Some(bao::Token::new(text.trim().to_string()));
        }
    }
    let result = run.bootstrap();
    if let Err(e) = run.tick.state.save(&run.agent.layout) {
        warn!("cannot save state: {e:#}");
    }
    result?;
    outln!("token stored in {}", run.token_path().display());
    Ok(Exit::Ok)
}
