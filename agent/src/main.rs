use std::process::ExitCode;

fn main() -> ExitCode {
    plegd::cli::main()
}
