//! Prints the `online-boutique` example template, generated from the Online Boutique release
//! manifests: `cargo run --bin examplegen -- ../shared/fixtures/apps/online-boutique.yaml >
//! templates/online-boutique/template.yaml`.
fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: examplegen <online-boutique release manifests.yaml>");
        std::process::exit(2);
    };
    let release = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        eprintln!("examplegen: {path}: {e}");
        std::process::exit(1);
    });
    match previewd::sandbox::example_templates::online_boutique_template(&release) {
        Ok(template) => print!("{template}"),
        Err(e) => {
            eprintln!("examplegen: {path}: {e}");
            std::process::exit(1);
        }
    }
}
