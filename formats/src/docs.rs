//! Man pages and shell completions of the rocemesh binaries, generated from their clap
//! definitions (feature `docs`), so that a flag is documented once, next to its definition.
//! Each binary's hidden `generate` command calls [`generate`]; packages install the output.

/// Write to standard output the man page (`what` = `man`) or the completions of a shell
/// (`bash`, `zsh`, `fish`, `elvish`, `powershell`) of `cmd`, installed as `name`.
pub fn generate(cmd: clap::Command, what: &str, name: &str) -> std::io::Result<()> {
    // clap wants 'static names without its `string` feature; the process prints and exits.
    let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
    let mut cmd = cmd.name(name).bin_name(name);
    let mut out = std::io::stdout().lock();
    if what == "man" {
        return clap_mangen::Man::new(cmd).render(&mut out);
    }
    let shell: clap_complete::Shell = what.parse().map_err(|_| {
        std::io::Error::other(format!("generate {what:?}: use man, bash, zsh, fish, elvish or powershell"))
    })?;
    clap_complete::generate(shell, &mut cmd, name, &mut out);
    Ok(())
}
