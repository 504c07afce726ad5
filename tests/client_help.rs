//! Every `client` command's `--help` ends with an example (issue 17, item 6), and every example
//! is a command line that parses as exactly that command.

use clap::CommandFactory;
use execution_provider::cli::Cli;

/// The leaf commands under `cmd`, each with its path of names.
fn leaves(cmd: &clap::Command, path: Vec<String>, out: &mut Vec<(Vec<String>, clap::Command)>) {
    let subcommands: Vec<_> = cmd
        .get_subcommands()
        .filter(|s| s.get_name() != "help")
        .collect();
    if subcommands.is_empty() {
        out.push((path, cmd.clone()));
        return;
    }
    for sub in subcommands {
        let mut next = path.clone();
        next.push(sub.get_name().to_owned());
        leaves(sub, next, out);
    }
}

/// The subcommand path a parsed command line selected.
fn selected(matches: &clap::ArgMatches) -> Vec<String> {
    let mut path = Vec::new();
    let mut at = matches;
    while let Some((name, sub)) = at.subcommand() {
        path.push(name.to_owned());
        at = sub;
    }
    path
}

#[test]
fn every_client_command_has_an_example_that_parses_as_that_command() {
    let cli = Cli::command();
    let client = cli.find_subcommand("client").expect("a client command");
    let mut found = Vec::new();
    leaves(client, vec!["client".to_owned()], &mut found);
    assert!(found.len() >= 25, "{} client commands", found.len());
    let mut problems = Vec::new();
    for (path, cmd) in &found {
        let help = cmd
            .get_after_help()
            .map(|h| h.to_string())
            .unwrap_or_default();
        let examples: Vec<&str> = help
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("execution-provider "))
            .collect();
        if !help.starts_with("Example") || examples.is_empty() {
            problems.push(format!("{}: no example in --help", path.join(" ")));
            continue;
        }
        for example in examples {
            let words = std::iter::once("execution-provider").chain(example.split_whitespace());
            match Cli::command().try_get_matches_from(words) {
                Ok(matches) if selected(&matches) == *path => {}
                Ok(matches) => problems.push(format!(
                    "{}: the example runs {:?}",
                    path.join(" "),
                    selected(&matches)
                )),
                Err(error) => problems.push(format!("{}: {error}", path.join(" "))),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
