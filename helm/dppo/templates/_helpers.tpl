{{/*
Every object name and label is built here.
*/}}

{{/* Refuse the values in one line: `fail` at install and template. helm lint logs a fail at INFO and renders on, so
the include of a template named by the message then fails `helm lint --strict` too, its error ending with the
message. */}}
{{- define "dppo.fail" -}}
{{- fail . }}
{{- include (printf "refused: %s" .) dict }}
{{- end }}

{{/* Chart name, overridable. */}}
{{- define "dppo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/*
Full name prefix. KubeRay appends "-xxxxx" for the cluster, "-head-xxxxx"/"-workers-worker-xxxxx" for pods and
"-head-svc" for the service, and cuts names at 63 characters, so this stays at 40.
*/}}
{{- define "dppo.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dppo.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the run's pods (KubeRay keeps pod-template labels it does not own itself). */}}
{{- define "dppo.selectorLabels" -}}
app.kubernetes.io/part-of: dppo
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object. `dppo status` finds RayJobs by app.kubernetes.io/name=dppo, so that label is
the chart's name whatever nameOverride says (nameOverride changes object names only). */}}
{{- define "dppo.labels" -}}
helm.sh/chart: {{ include "dppo.chart" . }}
app.kubernetes.io/name: {{ .Chart.Name }}
{{ include "dppo.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Pod labels: the selector labels, the component, and the user's extra labels. */}}
{{- define "dppo.podLabels" -}}
{{ include "dppo.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- with .root.Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "dppo.image" -}}
{{- $tag := .Values.image.tag | default (ternary (printf "%s-gpu" .Chart.AppVersion) .Chart.AppVersion (gt (int .Values.head.gpus) 0)) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/* Worker pods the run needs: ceil(actors / actorsPerPod); for a sweep, the Ray CPUs of `concurrent` trials
(each its driver and its actors, one Ray CPU each) over actorsPerPod. */}}
{{- define "dppo.workerReplicas" -}}
{{- $cpus := int .Values.actors }}
{{- if .Values.sweep.enabled }}{{ $cpus = mul (int .Values.sweep.concurrent) (add1 (int .Values.actors)) }}{{ end }}
{{- div (add $cpus (sub (int .Values.actorsPerPod) 1)) (int .Values.actorsPerPod) }}
{{- end }}

{{/* autoscaling.maxReplicas, by default the pods `actors` needs. */}}
{{- define "dppo.autoscalingMax" -}}
{{- if kindIs "invalid" .Values.autoscaling.maxReplicas }}{{ include "dppo.workerReplicas" . }}{{ else }}{{ int .Values.autoscaling.maxReplicas }}{{ end }}
{{- end }}

{{/* The actor group's starting pods: with autoscaling, autoscaling.initialReplicas (default: what `actors`
needs) clamped into [minReplicas, maxReplicas]; without, what `actors` needs. */}}
{{- define "dppo.actorReplicas" -}}
{{- if .Values.autoscaling.enabled }}
{{- $initial := include "dppo.workerReplicas" . | int }}
{{- if not (kindIs "invalid" .Values.autoscaling.initialReplicas) }}{{ $initial = int .Values.autoscaling.initialReplicas }}{{ end }}
{{- max (int .Values.autoscaling.minReplicas) (min $initial (include "dppo.autoscalingMax" . | int)) }}
{{- else }}
{{- include "dppo.workerReplicas" . }}
{{- end }}
{{- end }}

{{- define "dppo.configPath" -}}/etc/dppo/config.yaml{{- end }}

{{- define "dppo.metricsService" -}}{{ include "dppo.fullname" . }}-metrics{{- end }}

{{- define "dppo.claimName" -}}
{{- .Values.persistence.existingClaim | default (printf "%s-checkpoints" (include "dppo.fullname" .)) }}
{{- end }}

{{- define "dppo.runDir" -}}
{{- if .Values.persistence.enabled }}
{{- printf "%s/%s" (trimSuffix "/" .Values.persistence.mountPath) (include "dppo.fullname" .) }}
{{- else }}
{{- printf "/tmp/dppo/%s" (include "dppo.fullname" .) }}
{{- end }}
{{- end }}

{{/* The driver's command line (dppo train, or with sweep.enabled dppo sweep): the Ray job entrypoint. */}}
{{- define "dppo.entrypoint" -}}
{{- if .Values.sweep.enabled -}}
dppo sweep --config {{ include "dppo.sweepPath" . }} --out-dir {{ include "dppo.runDir" . }} --auto-resume
{{- else -}}
dppo train --config {{ include "dppo.configPath" . }}{{ if .Values.persistence.enabled }} --auto-resume{{ end }}
{{- end }}
{{- end }}

{{- define "dppo.sweepPath" -}}/etc/dppo/sweep.yaml{{- end }}

{{/* The sweep file (sweep.enabled): the training config beside it is every trial's base. Its trials' drivers
reserve one Ray CPU each (driver_cpus), as the worker group is sized. */}}
{{- define "dppo.sweepFile" -}}
{{- $sweep := .Values.sweep }}
{{- if not .Values.persistence.enabled }}
{{- include "dppo.fail" "sweep.enabled needs persistence.enabled: the trials (in the worker pods) and the sweep (on the head) share their run directories and checkpoints through the claim; set persistence.enabled=true with a ReadWriteMany claim" }}
{{- end }}
{{- if and (not .Values.persistence.existingClaim) (not (has "ReadWriteMany" .Values.persistence.accessModes)) }}
{{- include "dppo.fail" (printf "sweep.enabled: the head and every worker pod mount the claim, so it must be ReadWriteMany; set persistence.accessModes={ReadWriteMany} (a storage class that offers it: NFS, EFS, Filestore, CephFS) or persistence.existingClaim (now %s)" (join "," .Values.persistence.accessModes)) }}
{{- end }}
{{- if gt (int .Values.learners.replicas) 0 }}
{{- include "dppo.fail" "sweep.enabled with learners.replicas > 0: each trial trains in its own driver process (one learner, the update inside it) in a worker pod; set learners.replicas=0" }}
{{- end }}
{{- if gt (int .Values.head.gpus) 0 }}
{{- include "dppo.fail" "sweep.enabled with head.gpus > 0: the trials (each a driver with its update) run in the worker pods, not on the head; set head.gpus=0" }}
{{- end }}
{{- if eq $sweep.scheduler.name "pbt" }}
{{- $mutable := list }}
{{- range $key, $dist := $sweep.space }}{{ if not (hasPrefix "grid" (trim $dist)) }}{{ $mutable = append $mutable $key }}{{ end }}{{ end }}
{{- if not $mutable }}
{{- include "dppo.fail" "sweep.scheduler.name=pbt needs a sweep.space key to perturb that is not a grid, e.g. ppo.learning_rate: loguniform(1e-4, 1e-3)" }}
{{- end }}
{{- end }}
{{- $file := dict "name" (include "dppo.fullname" .) "base" (dict "config" (base (include "dppo.configPath" .)))
  "space" $sweep.space "scheduler" $sweep.scheduler "trials" (int $sweep.trials) "concurrent" (int $sweep.concurrent)
  "driver_cpus" 1 "metric" $sweep.metric
  "metrics" (dict "port" (int .Values.metrics.port) "host" "0.0.0.0" "linger_s" .Values.metrics.lingerSeconds) }}
{{- toYaml $file }}
{{- end }}

{{/*
The full training config: the preset for .Values.env (as `dppo train --env` picks it), the free-form
.Values.config deep-merged over it, then the keys the chart manages. An entry point (config.env.entry_point)
replaces the registered id: the env value is then empty.
*/}}

{{/* How the run's env is named: the registered id, or the entry point. */}}
{{- define "dppo.envName" -}}
{{- .Values.env | default (((.Values.config | default dict).env | default dict).entry_point) -}}
{{- end }}
{{/* A plain env id must be one the image registers (registered-envs.json, written by helm/values_schema.py):
a typo fails here, in one line with the ids that start like it, instead of in the driver on the head. module:EnvId-v0
(a package that registers the id on import) is left to the run's own check. */}}
{{- define "dppo.checkEnvId" -}}
{{- $env := .Values.env | default "" | toString }}
{{- /* package:EnvId-v0 and a PettingZoo module (mpe2.simple_spread_v3) are left to the run's own one-line check. */}}
{{- if and $env (not (contains ":" $env)) (not (regexMatch "^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)+_v[0-9]+$" $env)) }}
{{- $known := (.Files.Get "registered-envs.json" | fromJson) }}
{{- if not (has $env $known.ids) }}
{{- $name := lower (regexReplaceAll "^.*/" $env "") }}
{{- $like := list }}
{{- range $known.ids }}
{{- if hasPrefix (trunc 4 $name) (lower (regexReplaceAll "^.*/" . "")) }}{{ $like = append $like . }}{{ end }}
{{- end }}
{{- $hint := ternary (printf " Did you mean %s?" (join ", " (slice $like 0 (min 6 (len $like))))) "" (gt (len $like) 0) }}
{{- include "dppo.fail" (printf "env=%s is not an id the chart knows (gymnasium %s's, ale-py's ALE/ ids, dppo's own).%s An env that a package registers on import is written package:EnvId-v0 (e.g. minigrid:MiniGrid-Empty-5x5-v0; the run imports the package first); a PettingZoo env is its module, e.g. mpe2.simple_spread_v3" $env (index $known "gymnasium") $hint) }}
{{- end }}
{{- end }}
{{- end }}
{{- define "dppo.config" -}}
{{- $preset := dict }}
{{- range $name, $text := (.Files.Get "presets.yaml" | fromYaml) }}
{{- $data := $text | fromYaml }}
{{- if eq ((($data.env | default dict)).id | default "") $.Values.env }}
{{- $preset = $data }}
{{- end }}
{{- end }}
{{- $entryPoint := (((.Values.config | default dict).env | default dict).entry_point | default "") }}
{{- if and $entryPoint .Values.env }}
{{- include "dppo.fail" (printf "config.env.entry_point=%s and env=%s are both set: an entry point replaces the registered id; set env to null (or \"\") to train the entry point, or drop config.env.entry_point" $entryPoint .Values.env) }}
{{- end }}
{{- if not (or $entryPoint .Values.env) }}
{{- include "dppo.fail" "env is empty and config.env.entry_point is not set: name the env, e.g. env=CartPole-v1, or config.env.entry_point=mypackage.envs:MyEnv" }}
{{- end }}
{{- include "dppo.checkEnvId" . }}
{{- $managed := dict
  "env" (ternary (dict "id" nil) (dict "id" .Values.env) (not .Values.env))
  "run" (dict "actors" (int .Values.actors) "actor_cpus" 1 "run_dir" (include "dppo.runDir" .) "name" (include "dppo.fullname" .))
  "metrics" (dict "port" (int .Values.metrics.port) "host" "0.0.0.0" "linger_s" .Values.metrics.lingerSeconds) }}
{{- if not (kindIs "invalid" .Values.envsPerActor) }}{{ $_ := set $managed.env "num_envs" (int .Values.envsPerActor) }}{{ end }}
{{- if not (kindIs "invalid" .Values.segmentLength) }}{{ $_ := set $managed "ppo" (dict "segment_length" (int .Values.segmentLength)) }}{{ end }}
{{- if not (kindIs "invalid" .Values.totalSteps) }}{{ $_ := set $managed.run "total_steps" (int64 .Values.totalSteps) }}{{ end }}
{{- if not (kindIs "invalid" .Values.targetReturn) }}{{ $_ := set $managed.run "target_return" .Values.targetReturn }}{{ end }}
{{- if not (kindIs "invalid" .Values.seed) }}{{ $_ := set $managed.run "seed" (int .Values.seed) }}{{ end }}
{{- $learners := int .Values.learners.replicas }}
{{- if eq $learners 1 }}
{{- include "dppo.fail" "learners.replicas=1: use 0 (the update runs in the driver on the head) or 2 and more data-parallel learner pods" }}
{{- end }}
{{- if gt $learners 1 }}
{{- $_ := set $managed.run "learners" $learners }}
{{- $_ := set $managed.run "learner_resource" "dppo_learner" }}
{{- $_ := set $managed.run "learner_threads" (int .Values.learners.cpus) }}
{{- end }}
{{- /* One batch rule: a count in config.ppo replaces the preset's size, and a size its count (as dppo's own load does). */}}
{{- $userPPO := ((.Values.config | default dict).ppo | default dict) }}
{{- $presetPPO := ($preset.ppo | default dict) }}
{{- if hasKey $userPPO "num_minibatches" }}{{ $_ := unset $presetPPO "minibatch_size" }}{{ end }}
{{- if hasKey $userPPO "minibatch_size" }}{{ $_ := unset $presetPPO "num_minibatches" }}{{ end }}
{{- $config := mustMergeOverwrite (deepCopy $preset) (deepCopy .Values.config) $managed }}
{{- if gt $learners 1 }}
{{- $minibatch := int ((($config.ppo | default dict)).minibatch_size | default 0) }}
{{- if and (gt $minibatch 0) (ne (mod $minibatch $learners) 0) }}
{{- include "dppo.fail" (printf "learners.replicas=%d must divide ppo.minibatch_size=%d (each learner takes an equal share of every minibatch); set config.ppo.minibatch_size to a multiple of %d" $learners $minibatch $learners) }}
{{- end }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/* Environment shared by the head and worker containers. */}}
{{- define "dppo.env" -}}
- name: PYTHONUNBUFFERED
  value: "1"
# No usage reports to Ray's servers from the run's pods.
- name: RAY_USAGE_STATS_ENABLED
  value: "0"
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The TCP ports runtimeEnv downloads from when the run starts, as a JSON list (empty: it downloads nothing):
working_dir and py_modules URIs (the URL's port, else 443 for https, s3 and gs, 80 for http), and 443 for pip, uv
and conda (their package index). The NetworkPolicy opens them to networkPolicy.downloadPeers. */}}
{{- define "dppo.downloadPorts" -}}
{{- $env := .Values.runtimeEnv | default dict }}
{{- $uris := list }}
{{- with $env.working_dir }}{{ $uris = append $uris (toString .) }}{{ end }}
{{- if kindIs "slice" $env.py_modules }}{{ range $env.py_modules }}{{ $uris = append $uris (toString .) }}{{ end }}{{ end }}
{{- $ports := list }}
{{- range $uris }}
{{- $url := urlParse . }}
{{- $port := regexFind "[0-9]+$" (regexFind ":[0-9]+$" $url.host) }}
{{- if not $port }}{{ $port = get (dict "https" "443" "s3" "443" "gs" "443" "http" "80") (lower $url.scheme) }}{{ end }}
{{- if $port }}{{ $ports = append $ports (int $port) }}{{ end }}
{{- end }}
{{- if or $env.pip $env.uv $env.conda }}{{ $ports = append $ports 443 }}{{ end }}
{{- $ports | uniq | toJson }}
{{- end }}

{{/* NetworkPolicyPeer objects in words, for NOTES.txt: "any address" for 0.0.0.0/0, else their CIDRs or "N peer(s)". */}}
{{- define "dppo.peers" -}}
{{- $cidrs := list }}
{{- range . }}{{ with .ipBlock }}{{ $cidrs = append $cidrs .cidr }}{{ end }}{{ end }}
{{- if has "0.0.0.0/0" $cidrs }}any address{{ else if eq (len $cidrs) (len .) }}{{ join ", " $cidrs }}{{ else }}{{ len . }} peer(s) (networkPolicy values){{ end }}
{{- end }}
