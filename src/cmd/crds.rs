//! `koord-webhook crds`: the CRDs as multi-document YAML, the content of `crds/`.

use crate::apis::all_crds;

pub fn render() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in all_crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
