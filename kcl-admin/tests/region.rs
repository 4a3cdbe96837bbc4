//! A missing region is said as a setting to fix, not as a retryable failure (issue 35): no
//! `AWS_REGION`, no profile, instance metadata off.

use std::process::Command;

#[test]
fn a_missing_region_says_to_set_aws_region() -> anyhow::Result<()> {
    let home = tempfile_dir()?;
    let out = Command::new(env!("CARGO_BIN_EXE_kcl-admin"))
        .args(["leases", "--application-name", "orders-app"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &home)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        !out.status.success(),
        "succeeded without a region: {stderr}"
    );
    anyhow::ensure!(
        stderr.contains("set AWS_REGION (or a profile's region)"),
        "{stderr}"
    );
    anyhow::ensure!(!stderr.contains("Retryable"), "{stderr}");
    std::fs::remove_dir_all(&home)?;
    Ok(())
}

/// An empty home directory: no `~/.aws/config` to take a region from.
fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("kcl-admin-region-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
