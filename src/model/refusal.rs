//! Why an environment cannot be deployed as asked, as the `Ready` condition says it: the plan
//! (`crate::plan`) refuses with some of these, the reconciler with the others.

/// The kinds of refusal, each written as its name: the `Ready` condition's reason, which
/// alerts, dashboards and `kubectl wait` may select on: renaming one is a breaking change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    TemplateNotFound,
    /// The template asks for more than the operator's ceiling (`model::ceiling`).
    TemplateBeyondCeiling,
    /// The templates could not be rendered (a template error, a bad value, an engine failure).
    RenderFailed,
    /// The render asks for something templates may not create (`plan/guard.rs`).
    GuardRejected,
    /// An object breaks the content policy (`plan/policy/`).
    PolicyRejected,
    CRDsNotInstalled,
    TooManyObjects,
    /// Another environment holds the URL host.
    HostTaken,
    ChartInvalid,
    /// The chart repository could not be reached (retried).
    ChartUnavailable,
    ManifestsUnavailable,
    ManifestsTooLarge,
    SecretNotShared,
    SecretUnavailable,
    NamespaceConflict,
    KindNotServed,
    /// The API server refused an object (retried).
    ApplyRefused,
    /// A database the template asks for cannot be branched: no server admits it, or the server
    /// does not answer or refuses (retried).
    DatabaseUnavailable,
    /// The baseline's SQL failed, or its ConfigMap is missing.
    DatabaseBaselineFailed,
    /// The database server holds its limit of branches: the environment is `Queued`.
    DatabaseServerFull,
}

impl RefusalReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::TemplateNotFound => "TemplateNotFound",
            RefusalReason::TemplateBeyondCeiling => "TemplateBeyondCeiling",
            RefusalReason::RenderFailed => "RenderFailed",
            RefusalReason::GuardRejected => "GuardRejected",
            RefusalReason::PolicyRejected => "PolicyRejected",
            RefusalReason::CRDsNotInstalled => "CRDsNotInstalled",
            RefusalReason::TooManyObjects => "TooManyObjects",
            RefusalReason::HostTaken => "HostTaken",
            RefusalReason::ChartInvalid => "ChartInvalid",
            RefusalReason::ChartUnavailable => "ChartUnavailable",
            RefusalReason::ManifestsUnavailable => "ManifestsUnavailable",
            RefusalReason::ManifestsTooLarge => "ManifestsTooLarge",
            RefusalReason::SecretNotShared => "SecretNotShared",
            RefusalReason::SecretUnavailable => "SecretUnavailable",
            RefusalReason::NamespaceConflict => "NamespaceConflict",
            RefusalReason::KindNotServed => "KindNotServed",
            RefusalReason::ApplyRefused => "ApplyRefused",
            RefusalReason::DatabaseUnavailable => "DatabaseUnavailable",
            RefusalReason::DatabaseBaselineFailed => "DatabaseBaselineFailed",
            RefusalReason::DatabaseServerFull => "DatabaseServerFull",
        }
    }
}

impl std::fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
