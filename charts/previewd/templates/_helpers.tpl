{{/* The release's full name, at most 63 characters. */}}
{{- define "previewd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "previewd.serviceAccountName" -}}
{{- default (include "previewd.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "previewd.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "previewd.labels" -}}
{{ include "previewd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The kinds templates may create, as JSON: --template-kinds, and the RBAC rules in rbac.yaml. */}}
{{- define "previewd.templateKinds" -}}
{{- concat .Values.templateKinds .Values.extraTemplateKinds | toJson -}}
{{- end -}}

{{/* What template Roles may grant, as JSON: --template-role-rules, and the environment role in rbac.yaml. */}}
{{- define "previewd.templateRoleRules" -}}
{{- .Values.templateRoleRules | toJson -}}
{{- end -}}
