//! `execution-helper`: the fixed program run inside an executor Pod (and by the local
//! transport). One JSON request on stdin, one JSON envelope line on stdout; see
//! `execution_provider::helper`.

fn main() -> std::process::ExitCode {
    execution_provider::helper::main_entry()
}
