//! A client for a registered target cluster, from the kubeconfig its `PreviewCluster` names.
//!
//! The kubeconfig comes from a Secret, not from previewd's own machine, so only what it holds
//! inline is used: the server, its CA and TLS name, and a token or a client certificate given
//! as data. A credential plugin (`exec`, `auth-provider`) would run a program inside previewd,
//! and a file reference (`tokenFile`, `client-certificate`, `certificate-authority`) would read
//! previewd's own files (its ServiceAccount token among them): both are refused by name, as
//! are a proxy and skipping TLS verification.

use kube::config::{Kubeconfig, NamedAuthInfo, NamedCluster};

/// Parses `yaml` and builds a client for its current context, or says what is refused.
pub async fn target_client(yaml: &str) -> Result<kube::Client, String> {
    let kubeconfig = Kubeconfig::from_yaml(yaml).map_err(|e| format!("not a kubeconfig: {e}"))?;
    inline_only(&kubeconfig)?;
    super::client::from_kubeconfig(kubeconfig)
        .await
        .map_err(|e| e.to_string())
}

/// Refuses every field that reaches outside the kubeconfig itself.
pub fn inline_only(kubeconfig: &Kubeconfig) -> Result<(), String> {
    kubeconfig.clusters.iter().try_for_each(cluster_inline)?;
    kubeconfig.auth_infos.iter().try_for_each(user_inline)
}

fn cluster_inline(named: &NamedCluster) -> Result<(), String> {
    let Some(cluster) = &named.cluster else {
        return Ok(());
    };
    let refused = [
        (
            "certificate-authority",
            cluster.certificate_authority.is_some(),
        ),
        ("proxy-url", cluster.proxy_url.is_some()),
        (
            "insecure-skip-tls-verify",
            cluster.insecure_skip_tls_verify == Some(true),
        ),
    ];
    refuse_any(&format!("cluster {:?}", named.name), &refused)
}

fn user_inline(named: &NamedAuthInfo) -> Result<(), String> {
    let Some(user) = &named.auth_info else {
        return Ok(());
    };
    let refused = [
        ("exec", user.exec.is_some()),
        ("auth-provider", user.auth_provider.is_some()),
        ("tokenFile", user.token_file.is_some()),
        ("client-certificate", user.client_certificate.is_some()),
        ("client-key", user.client_key.is_some()),
    ];
    refuse_any(&format!("user {:?}", named.name), &refused)
}

fn refuse_any(what: &str, fields: &[(&str, bool)]) -> Result<(), String> {
    let set: Vec<&str> = fields
        .iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| *name)
        .collect();
    if set.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{what} uses {}: a registered cluster's kubeconfig may only hold its credentials inline (server, certificate-authority-data, token or client-certificate-data and client-key-data)",
        set.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(cluster: &str, user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {{cluster: t, user: u}}\nclusters:\n- name: t\n  cluster:\n    server: https://127.0.0.1:6443\n{cluster}users:\n- name: u\n  user:\n{user}"
        )
    }

    #[test]
    fn only_inline_credentials_are_accepted() {
        let inline = kubeconfig("    certificate-authority-data: Zm9v\n", "    token: abc\n");
        let parsed = Kubeconfig::from_yaml(&inline).unwrap();
        assert_eq!(inline_only(&parsed), Ok(()));
        for (cluster, user, named) in [
            (
                "",
                "    exec: {apiVersion: client.authentication.k8s.io/v1, command: sh, args: [-c, id]}\n",
                "exec",
            ),
            (
                "",
                "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
                "tokenFile",
            ),
            (
                "",
                "    client-certificate: /etc/hostname\n    client-key: /etc/hostname\n",
                "client-certificate",
            ),
            (
                "",
                "    auth-provider: {name: oidc, config: {}}\n",
                "auth-provider",
            ),
            (
                "    certificate-authority: /etc/ssl/certs/ca.pem\n",
                "    token: abc\n",
                "certificate-authority",
            ),
            (
                "    proxy-url: http://10.0.0.1:3128\n",
                "    token: abc\n",
                "proxy-url",
            ),
            (
                "    insecure-skip-tls-verify: true\n",
                "    token: abc\n",
                "insecure-skip-tls-verify",
            ),
        ] {
            let parsed = Kubeconfig::from_yaml(&kubeconfig(cluster, user)).unwrap();
            let refused = inline_only(&parsed).expect_err(named);
            assert!(refused.contains(named), "{refused}");
        }
    }
}
