//! Running the built `kcl-admin` as an operator would, with the emulators' environment.

use std::process::{Command, Output};

use kcl_integration_tests::Context;

const ADMIN: &str = env!("CARGO_BIN_EXE_kcl-admin");

/// Runs `kcl-admin ARGS`, printing what it printed (for a failing test's output).
pub(crate) fn admin(ctx: &Context, args: &[&str]) -> anyhow::Result<Output> {
    admin_with(ctx, args, &[])
}

/// As [`admin`], with `env` over the emulators' environment.
#[allow(dead_code)]
pub(crate) fn admin_with(
    ctx: &Context,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<Output> {
    // `KCL_ADMIN_BIN`: another build of the binary (an older one, to see a test fail on it).
    let bin = std::env::var("KCL_ADMIN_BIN").unwrap_or_else(|_| ADMIN.to_owned());
    let out = Command::new(bin)
        .args(args)
        .envs(ctx.worker_env())
        .envs(env.iter().copied())
        .output()?;
    eprintln!(
        "kcl-admin {}:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out)
}
