//! `vkgdr`, the command-line tool: everything is in the library of this package
//! ([`vkgdr_cli::main`]).

fn main() -> std::process::ExitCode {
    vkgdr_cli::main()
}
