{{/* Labels of every object (the same as `koord-webhook manifests` gives them). */}}
{{- define "koord-webhook.labels" -}}
app.kubernetes.io/name: koord-webhook
app.kubernetes.io/part-of: koordinator
{{- end }}

{{- define "koord-webhook.selectorLabels" -}}
app.kubernetes.io/name: koord-webhook
{{- end }}

{{- define "koord-webhook.image" -}}
{{- if .Values.image.digest }}
{{- .Values.image.repository }}@{{ .Values.image.digest }}
{{- else }}
{{- .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{/* "true" in a shadow install (`mode: shadow`), else "false"; any other mode fails. */}}
{{- define "koord-webhook.shadow" -}}
{{- if not (has .Values.mode (list "enforce" "shadow")) }}{{ fail (printf "mode: %q is neither enforce nor shadow" .Values.mode) }}{{ end }}
{{- eq .Values.mode "shadow" }}
{{- end }}

{{/* The Service the entries call: Koordinator's name when enforcing, the shadow's own. */}}
{{- define "koord-webhook.serviceName" -}}
{{- ternary "koord-webhook-shadow" "koordinator-webhook-service" (eq (include "koord-webhook.shadow" .) "true") }}
{{- end }}

{{/* The name of what a shadow owns cluster-wide (ClusterRole, its Role beside Koordinator's
     ConfigMaps), koord-webhook's otherwise. */}}
{{- define "koord-webhook.clusterName" -}}
{{- ternary "koord-webhook-shadow" "koord-webhook" (eq (include "koord-webhook.shadow" .) "true") }}
{{- end }}

{{/* Where Koordinator's ConfigMaps are read: `serve.config-namespace`, else the release's
     namespace when enforcing, Koordinator's default one in a shadow. */}}
{{- define "koord-webhook.configNamespace" -}}
{{- $default := ternary "koordinator-system" .Release.Namespace (eq (include "koord-webhook.shadow" .) "true") }}
{{- index .Values.serve "config-namespace" | default $default }}
{{- end }}

{{/* Whether gate (list $ name default) is on. */}}
{{- define "koord-webhook.gateEnabled" -}}
{{- $root := index . 0 }}{{ $name := index . 1 }}{{ $default := index . 2 }}
{{- if hasKey $root.Values.featureGates $name }}{{ index $root.Values.featureGates $name }}{{ else }}{{ $default }}{{ end }}
{{- end }}

{{/* Whether entry name (list $ name) is in Audit (webhooks.actions: its own value, or `all`). */}}
{{- define "koord-webhook.audited" -}}
{{- $root := index . 0 }}{{ $name := index . 1 }}
{{- $actions := $root.Values.webhooks.actions }}
{{- range $key, $action := $actions }}
{{- if ne $action "Audit" }}{{ fail (printf "webhooks.actions of %s: %q; an entry's action is Audit" $key $action) }}{{ end }}
{{- end }}
{{- or (eq (include "koord-webhook.shadow" $root) "true") (hasKey $actions "all") (hasKey $actions $name) }}
{{- end }}

{{/* The failurePolicy of entry (list $ entry): Ignore in Audit, else its own value, else `all`,
     else the table's. Entries that share an endpoint are put in Audit together. */}}
{{- define "koord-webhook.failurePolicy" -}}
{{- $root := index . 0 }}{{ $entry := index . 1 }}
{{- $table := $root.Files.Get "files/webhooks.yaml" | fromYaml }}
{{- $audited := include "koord-webhook.audited" (list $root $entry.name) }}
{{- range $kind := list "mutating" "validating" }}
{{- range $other := index $table $kind }}
{{- if and (eq $other.path $entry.path) (ne (include "koord-webhook.audited" (list $root $other.name)) $audited) }}
{{- fail (printf "webhooks.actions: %s and %s share the rules of %s: name them both" $entry.name $other.name $entry.path) }}
{{- end }}
{{- end }}
{{- end }}
{{- $policies := $root.Values.webhooks.failurePolicy }}
{{- $policy := $entry.failurePolicy }}
{{- if hasKey $policies "all" }}{{ $policy = index $policies "all" }}{{ end }}
{{- if hasKey $policies $entry.name }}{{ $policy = index $policies $entry.name }}{{ end }}
{{- if not (has $policy (list "Fail" "Ignore")) }}
{{- fail (printf "webhooks.failurePolicy of %s: %q is neither Fail nor Ignore" $entry.name $policy) }}
{{- end }}
{{- if eq $audited "true" }}{{ $policy = "Ignore" }}{{ end }}
{{- $policy }}
{{- end }}

{{/* One webhook entry (list $ entry) as a JSON object. */}}
{{- define "koord-webhook.entry" -}}
{{- $root := index . 0 }}{{ $entry := index . 1 }}
{{- $out := deepCopy $entry.base }}
{{- if eq (include "koord-webhook.shadow" $root) "true" }}
{{- /* A shadow's entries are all validating ones, under names of its own. */}}
{{- $_ := set $out "name" (printf "%s.shadow.koord-webhook.io" (first (splitList "." $entry.name))) }}
{{- $_ := unset $out "reinvocationPolicy" }}
{{- end }}
{{- $service := dict "name" (include "koord-webhook.serviceName" $root) "namespace" $root.Release.Namespace "path" $entry.path "port" 443 }}
{{- $_ := set $out "clientConfig" (dict "service" $service) }}
{{- $_ := set $out "failurePolicy" (include "koord-webhook.failurePolicy" (list $root $entry)) }}
{{- $_ := set $out "timeoutSeconds" (int $root.Values.webhooks.timeoutSeconds) }}
{{- if and $root.Values.webhooks.narrowCalls (ne (include "koord-webhook.shadow" $root) "true") $entry.matchConditions }}
{{- /* The replicas' user name in a condition names the release's namespace. */}}
{{- $conditions := list }}
{{- range $entry.matchConditions }}
{{- $conditions = append $conditions (dict "name" .name "expression" (replace "__RELEASE_NAMESPACE__" $root.Release.Namespace .expression)) }}
{{- end }}
{{- $_ := set $out "matchConditions" $conditions }}
{{- end }}
{{- if $entry.excludeSystemNamespaces }}
{{- $names := concat (list $root.Release.Namespace "kube-system") $root.Values.webhooks.excludeNamespaces }}
{{- if and (eq (include "koord-webhook.shadow" $root) "true") (ne $root.Release.Namespace "koordinator-system") }}
{{- /* A shadow also skips the namespace an enforcing install lives in (Koordinator's). */}}
{{- $names = concat (list $root.Release.Namespace "koordinator-system" "kube-system") $root.Values.webhooks.excludeNamespaces }}
{{- end }}
{{- $expressions := list (dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" $names) }}
{{- range $root.Values.webhooks.excludeNamespaceLabels }}
{{- $kv := splitn "=" 2 . }}
{{- if contains "=" . }}
{{- $expressions = append $expressions (dict "key" $kv._0 "operator" "NotIn" "values" (list $kv._1)) }}
{{- else }}
{{- $expressions = append $expressions (dict "key" . "operator" "DoesNotExist") }}
{{- end }}
{{- end }}
{{- $_ := set $out "namespaceSelector" (dict "matchExpressions" $expressions) }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* The `serve` arguments that carry the values (the same flags `koord-webhook manifests` writes). */}}
{{- define "koord-webhook.serveArgs" -}}
- serve
- --port=9443
{{- with .Values.featureGates }}
{{- $gates := list }}
{{- range $name, $on := . }}{{ $gates = append $gates (printf "%s=%t" $name $on) }}{{ end }}
- --feature-gates={{ join "," $gates }}
{{- end }}
{{- if eq (include "koord-webhook.shadow" .) "true" }}
- --mode=shadow
{{- end }}
{{- $timeout := int .Values.webhooks.timeoutSeconds }}
{{- if or (lt $timeout 1) (gt $timeout 30) }}{{ fail "webhooks.timeoutSeconds must be 1-30" }}{{ end }}
{{- if ne $timeout 10 }}
- --webhook-timeout-seconds={{ $timeout }}
{{- end }}
{{- $policies := .Values.webhooks.failurePolicy }}
{{- if hasKey $policies "all" }}
- --failure-policy=all={{ index $policies "all" }}
{{- end }}
{{- range $name, $policy := $policies }}
{{- if ne $name "all" }}
- --failure-policy={{ $name }}={{ $policy }}
{{- end }}
{{- end }}
{{- range .Values.webhooks.excludeNamespaces }}
- --exclude-namespace={{ . }}
{{- end }}
{{- range .Values.webhooks.excludeNamespaceLabels }}
- --exclude-namespace-label={{ . }}
{{- end }}
{{- if not .Values.webhooks.narrowCalls }}
- --narrow-calls=off
{{- end }}
{{- range $name, $action := .Values.webhooks.actions }}
- --entry-action={{ $name }}={{ $action }}
{{- end }}
{{- with .Values.clientCA }}
{{- if and .configMap .secret }}{{ fail "clientCA: a configMap or a secret, not both" }}{{ end }}
{{- if or .configMap .secret }}
- --client-ca-file=/etc/koord-webhook/client-ca/{{ .key }}
{{- end }}
{{- end }}
{{- if eq .Values.certificates.mode "external" }}
- --cert-mode=external
{{- else if ne .Values.certificates.mode "self" }}
{{- fail "certificates.mode is self or external" }}
{{- end }}
{{- if ne .Values.logging.format "text" }}
- --log-format={{ .Values.logging.format }}
{{- end }}
{{- include "koord-webhook.serveFlags" . }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* The Pod's terminationGracePeriodSeconds: the drain (`serve: {drain-delay: ...}`, 10s by default)
     plus 20 s for the Lease's release, requests in flight and slack, as `koord-webhook manifests`
     derives it (src/server/shutdown.rs). */}}
{{- define "koord-webhook.terminationGracePeriod" -}}
{{- $drain := toString (index .Values.serve "drain-delay" | default "10s") }}
{{- $units := dict "s" 1 "m" 60 "h" 3600 }}
{{- if not (regexMatch "^[0-9]+[smh]$" $drain) }}
{{- fail (printf "serve.drain-delay: %s: give whole seconds, minutes or hours (25s, 2m)" $drain) }}
{{- end }}
{{- $unit := substr (int (sub (len $drain) 1)) (len $drain) $drain }}
{{- add (mul (trimSuffix $unit $drain | atoi) (index $units $unit)) 20 }}
{{- end }}

{{/* The `serve:` values as flags, each checked against files/serve-flags.yaml (koord-webhook's own
     table of its flags: the same check as `koord-webhook manifests --serve-flag`). */}}
{{- define "koord-webhook.serveFlags" -}}
{{- $table := .Files.Get "files/serve-flags.yaml" | fromYaml }}
{{- range $name, $value := .Values.serve }}
{{- if hasKey $table.owned $name }}
{{- fail (printf "serve.%s: --%s is set from %s, not as a serve flag" $name $name (index $table.owned $name)) }}
{{- end }}
{{- if not (hasKey $table.flags $name) }}
{{- fail (printf "serve.%s: koord-webhook serve has no flag --%s" $name $name) }}
{{- end }}
{{- $flag := index $table.flags $name }}
{{- $values := ternary $value (list $value) (kindIs "slice" $value) }}
{{- if and (gt (len $values) 1) (not $flag.repeatable) }}
{{- fail (printf "serve.%s: --%s takes one value" $name $name) }}
{{- end }}
{{- range $values }}
{{- if $flag.switch }}
{{- if not (kindIs "bool" .) }}{{ fail (printf "serve.%s: --%s is a switch: true or false" $name $name) }}{{ end }}
{{- if . }}
- --{{ $name }}
{{- end }}
{{- else }}
{{- /* Whole numbers as integers: Helm reads every number as a float (8388608 would be 8.388608e+06). */}}
{{- $text := ternary (int64 .) . (and (kindIs "float64" .) (eq (float64 (int64 .)) .)) }}
- {{ printf "--%s=%v" $name $text | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
