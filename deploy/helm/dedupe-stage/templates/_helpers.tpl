{{/* The chart's name, or nameOverride. */}}
{{- define "dedupe-stage.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name: the StatefulSet's, and so each pod's name prefix
and each instance's name (scale_out.instance). A release named like the
chart is not doubled.
*/}}
{{- define "dedupe-stage.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dedupe-stage.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "dedupe-stage.labels" -}}
helm.sh/chart: {{ include "dedupe-stage.chart" . }}
{{ include "dedupe-stage.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the pods. */}}
{{- define "dedupe-stage.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dedupe-stage.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dedupe-stage.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dedupe-stage.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The pods: one for a single instance, group.replicas for a group. */}}
{{- define "dedupe-stage.replicas" -}}
{{- if .Values.group.enabled }}{{ int .Values.group.replicas }}{{ else }}1{{ end }}
{{- end }}

{{/*
state.partitions: the value, else 12 for a group (a multiple of 1, 2, 3, 4
and 6 instances) and 8, the stage's default, for one instance. A group whose
partitions are not a multiple of its replicas fails, unless
group.allowUnevenPartitions.
*/}}
{{- define "dedupe-stage.partitions" -}}
{{- $p := .Values.partitions }}
{{- if or (kindIs "invalid" $p) (eq (toString $p) "") }}
{{- $p = ternary 12 8 .Values.group.enabled }}
{{- end }}
{{- $p = int $p }}
{{- if or (lt $p 1) (gt $p 1024) }}
{{- fail (printf "partitions: %d, want 1..1024" $p) }}
{{- end }}
{{- if .Values.group.enabled }}
{{- $r := int .Values.group.replicas }}
{{- if lt $r 1 }}
{{- fail (printf "group.replicas: %d, want at least 1" $r) }}
{{- end }}
{{- if and (ne (mod $p $r) 0) (not .Values.group.allowUnevenPartitions) }}
{{- fail (printf "partitions: %d is not a multiple of group.replicas %d: instances balance whole partitions, so the busiest bounds the group; choose a multiple of every instance count you will run (12 for 1, 2, 3, 4 or 6), or set group.allowUnevenPartitions" $p $r) }}
{{- end }}
{{- end }}
{{- $p }}
{{- end }}

{{/* Where the NATS secrets are mounted. */}}
{{- define "dedupe-stage.credsDir" -}}/etc/dedupe-stage/nats-creds{{- end }}
{{- define "dedupe-stage.tlsDir" -}}/etc/dedupe-stage/nats-tls{{- end }}

{{/* The Secret holding the DEDUPE_NATS_* credentials, if any. */}}
{{- define "dedupe-stage.authSecret" -}}
{{- $a := .Values.nats.auth }}
{{- if $a.existingSecret }}
{{- $a.existingSecret }}
{{- else if or $a.token $a.user $a.password }}
{{- printf "%s-nats" (include "dedupe-stage.fullname" .) }}
{{- end }}
{{- end }}

{{/* The Secret holding the .creds file, if any. */}}
{{- define "dedupe-stage.credsSecret" -}}
{{- $c := .Values.nats.creds }}
{{- if $c.existingSecret }}
{{- $c.existingSecret }}
{{- else if $c.content }}
{{- printf "%s-nats-creds" (include "dedupe-stage.fullname" .) }}
{{- end }}
{{- end }}

{{/* The Secret holding the TLS files, if TLS is on. */}}
{{- define "dedupe-stage.tlsSecret" -}}
{{- $t := .Values.nats.tls }}
{{- if $t.enabled }}
{{- if $t.existingSecret }}
{{- $t.existingSecret }}
{{- else }}
{{- if not $t.ca }}
{{- fail "nats.tls.enabled: give nats.tls.existingSecret, or nats.tls.ca (with cert and key for mutual TLS)" }}
{{- end }}
{{- if ne (empty $t.cert) (empty $t.key) }}
{{- fail "nats.tls.cert and nats.tls.key: give both for mutual TLS, or neither" }}
{{- end }}
{{- printf "%s-nats-tls" (include "dedupe-stage.fullname" .) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The stage's configuration: .Values.config with what the chart sets itself.
A field the chart sets, given in config too, fails: it would be silently
overridden.
*/}}
{{- define "dedupe-stage.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- $owned := dict "nats.url" "nats.url" "nats.tls" "nats.tls" "state.partitions" "partitions" "state.data_dir" "persistence (the data dir is /data)" "http.addr" "httpPort" "scale_out.enabled" "group.enabled" "scale_out.instance" "group.enabled (each pod's name)" }}
{{- range $field := keys $owned | sortAlpha }}
{{- $parts := splitList "." $field }}
{{- $section := get $cfg (first $parts) }}
{{- if and (kindIs "map" $section) (hasKey $section (last $parts)) }}
{{- fail (printf "config.%s: the chart sets it; use the value %s" $field (get $owned $field)) }}
{{- end }}
{{- end }}
{{- $auth := .Values.nats.auth }}
{{- if and $auth.token (or $auth.user $auth.password) }}
{{- fail "nats.auth: give a token, or a user and password, not both" }}
{{- end }}
{{- if and (include "dedupe-stage.credsSecret" .) (or $auth.token $auth.user) }}
{{- fail "nats.creds and nats.auth: the stage logs in with one method" }}
{{- end }}
{{- if not .Values.nats.url }}
{{- fail "nats.url: the stage needs a NATS server with JetStream (a group needs a JetStream cluster)" }}
{{- end }}
{{- $nats := get $cfg "nats" | default dict }}
{{- $_ := set $nats "url" .Values.nats.url }}
{{- if include "dedupe-stage.tlsSecret" . }}
{{- $t := .Values.nats.tls }}
{{- $dir := include "dedupe-stage.tlsDir" . }}
{{- $tls := dict "ca_file" (printf "%s/ca.crt" $dir) }}
{{- if or (and $t.existingSecret $t.mutual) (and (not $t.existingSecret) $t.cert) }}
{{- $_ := set $tls "cert_file" (printf "%s/tls.crt" $dir) }}
{{- $_ := set $tls "key_file" (printf "%s/tls.key" $dir) }}
{{- end }}
{{- $_ := set $nats "tls" $tls }}
{{- end }}
{{- $_ := set $cfg "nats" $nats }}
{{- $state := get $cfg "state" | default dict }}
{{- $_ := set $state "partitions" (int (include "dedupe-stage.partitions" .)) }}
{{- $_ := set $cfg "state" $state }}
{{- $so := get $cfg "scale_out" | default dict }}
{{- $_ := set $so "enabled" .Values.group.enabled }}
{{- $_ := set $cfg "scale_out" $so }}
{{- toYaml $cfg }}
{{- end }}
