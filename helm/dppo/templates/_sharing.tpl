{{/*
A run on a shared cluster: who admits it (Kueue or a KubeRay batch scheduler), and what KubeRay deletes when it ends.
*/}}

{{/* Values that KubeRay, Kueue or the batch schedulers would reject, refused at install with the fix. */}}
{{- define "dppo.checkScheduling" -}}
{{- $s := .Values.scheduling }}
{{- if not (semverCompare ">=1.5.1-0" .Values.kuberayVersion) }}
{{- include "dppo.fail" (printf "kuberayVersion=%s: the chart needs KubeRay >= 1.5.1 (ray.io/v1 RayJob with authOptions); upgrade the operator, or set kuberayVersion to the version it runs" .Values.kuberayVersion) }}
{{- end }}
{{- if and (eq $s.admission "kueue") .Values.autoscaling.enabled }}
{{- include "dppo.fail" "scheduling.admission=kueue with autoscaling.enabled: Kueue admits a RayJob for a fixed size and rejects in-tree autoscaling; set autoscaling.enabled=false (the worker group then has ceil(actors / actorsPerPod) pods)" }}
{{- end }}
{{- if and (eq $s.admission "kueue") (not .Values.job.shutdownAfterJobFinishes) }}
{{- include "dppo.fail" "scheduling.admission=kueue with job.shutdownAfterJobFinishes=false: KubeRay refuses to suspend a RayJob that keeps its cluster, and Kueue admits RayJobs by suspending them; set job.shutdownAfterJobFinishes=true" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (eq .Values.autoscaling.version "v2") (ne .Values.head.restartPolicy "Never") }}
{{- include "dppo.fail" "head.restartPolicy=Always with autoscaling.version=v2: KubeRay needs restartPolicy Never on every Ray pod with autoscaler v2; set head.restartPolicy=Never" }}
{{- end }}
{{- end }}

{{/* The RayJob's labels for its admission (KubeRay copies them to the RayCluster, whose pods the scheduler sees). */}}
{{- define "dppo.schedulingLabels" -}}
{{- $s := .Values.scheduling }}
{{- $labels := dict }}
{{- if eq $s.admission "kueue" }}
{{- $_ := set $labels "kueue.x-k8s.io/queue-name" $s.queue }}
{{- else if eq $s.admission "volcano" }}
{{- with $s.queue }}{{ $_ := set $labels "volcano.sh/queue-name" . }}{{ end }}
{{- with $s.priorityClassName }}{{ $_ := set $labels "ray.io/priority-class-name" . }}{{ end }}
{{- else if eq $s.admission "yunikorn" }}
{{- $_ := set $labels "ray.io/gang-scheduling-enabled" "true" }}
{{- $_ := set $labels "yunikorn.apache.org/app-id" (include "dppo.fullname" .) }}
{{- with $s.queue }}{{ $_ := set $labels "yunikorn.apache.org/queue" . }}{{ end }}
{{- else if eq $s.admission "scheduler-plugins" }}
{{- $_ := set $labels "ray.io/gang-scheduling-enabled" "true" }}
{{- end }}
{{- with $labels }}{{ toYaml . }}{{ end }}
{{- end }}

{{/*
KubeRay's deletionRules for the run, as a YAML list, or nothing where the chart uses shutdownAfterJobFinishes and
ttlSecondsAfterFinished instead: an operator older than 1.6 (the RayJobDeletionPolicy gate is off there by default),
Kueue (KubeRay suspends only RayJobs with shutdownAfterJobFinishes, which excludes deletionRules), or
job.shutdownAfterJobFinishes=false (nothing is deleted). A failure is either condition: the Ray job FAILED, or the
deployment Failed without a failed Ray job (the submitter lost its head, a deadline passed).
*/}}
{{- define "dppo.deletionRules" -}}
{{- $job := .Values.job }}
{{- if and $job.shutdownAfterJobFinishes (semverCompare ">=1.6.0-0" .Values.kuberayVersion) (ne .Values.scheduling.admission "kueue") }}
{{- $rules := list (dict "condition" (dict "jobStatus" "SUCCEEDED" "ttlSeconds" (int $job.ttlSecondsAfterFinished)) "policy" "DeleteCluster") }}
{{- range list (dict "jobStatus" "FAILED") (dict "jobDeploymentStatus" "Failed") }}
{{- /* KubeRay cannot delete an autoscaled group's workers; its autoscaler removes the idle ones. */}}
{{- if not $.Values.autoscaling.enabled }}
{{- $rules = append $rules (dict "condition" (merge (dict "ttlSeconds" 0) .) "policy" "DeleteWorkers") }}
{{- end }}
{{- $rules = append $rules (dict "condition" (merge (dict "ttlSeconds" (int $job.keepHeadOnFailureSeconds)) .) "policy" "DeleteCluster") }}
{{- end }}
{{- toYaml $rules }}
{{- else -}}
[]
{{- end }}
{{- end }}
