{{/*
The trainer's arguments. The image's ENTRYPOINT is `megdet launch`, which turns the operator's
PET_* env into torchrun arguments; everything after it is `megdet train ...`. Only spec fields
are passed: the trainer plans LR and schedule itself from the world size it finds.
*/}}
{{- define "megdet.trainArgs" -}}
{{- $v := .Values -}}
{{- $args := list "train" "--config" $v.config "--output" (printf "/output/%s" (include "megdet.runName" .)) -}}
{{- $args = concat $args (list "--train-json" (printf "/data/%s" $v.dataset.trainJson) "--train-images" (printf "/data/%s" $v.dataset.trainImages)) -}}
{{- if $v.dataset.valJson -}}
{{- $args = concat $args (list "--val-json" (printf "/data/%s" $v.dataset.valJson) "--val-images" (printf "/data/%s" $v.dataset.valImages)) -}}
{{- end -}}
{{- $steps := list -}}
{{- range $v.steps -}}{{- $steps = append $steps (toString (int64 .)) -}}{{- end -}}
{{- $args = concat $args (list
  "MEGDET.IMAGES_PER_GPU" (toString (int64 $v.imagesPerGpu))
  "MEGDET.ACCUMULATION_STEPS" (toString (int64 $v.accumulationSteps))
  "SOLVER.BASE_LR" (include "megdet.pyFloat" $v.baseLr)
  "MEGDET.REFERENCE_BATCH" (toString (int64 $v.referenceBatch))
  "MEGDET.SCALING" $v.scaling
  "MEGDET.SCHEDULE" $v.schedule
  "SOLVER.MAX_ITER" (toString (int64 $v.maxIter))
  "SOLVER.STEPS" (printf (ternary "(%s,)" "(%s)" (eq (len $steps) 1)) (join ", " $steps))
  "SOLVER.WARMUP_ITERS" (toString (int64 $v.warmupIters))
  "MEGDET.SYNC_BN" $v.syncBN
  "MEGDET.BN_GROUP_SIZE" (toString (int64 $v.bnGroupSize))
  "MEGDET.RESIZE" $v.elastic.resize
  "MEGDET.METRICS.PORT" (ternary (toString (int64 $v.metrics.port)) "0" $v.metrics.enabled)) -}}
{{- /* `megdet train --num-workers` spawns processes; torchrun does that in a pod, so
       DataLoader workers go through detectron2's own key. */ -}}
{{- if $v.resumeFrom -}}
{{- $args = concat $args (list "MEGDET.RESUME_FROM" (toString $v.resumeFrom)) -}}
{{- end -}}
{{- if $v.allowUnsafeWeights -}}
{{- $args = concat $args (list "MEGDET.ALLOW_UNSAFE_WEIGHTS" "True") -}}
{{- end -}}
{{- if not (kindIs "invalid" $v.numWorkers) -}}
{{- $args = concat $args (list "DATALOADER.NUM_WORKERS" (toString (int64 $v.numWorkers))) -}}
{{- end -}}
{{- range $key, $value := $v.extraOverrides -}}
{{- $args = concat $args (list $key (include "megdet.pyValue" $value)) -}}
{{- end -}}
{{- include "megdet.yaml" $args -}}
{{- end -}}

{{/* Container env: NCCL transport, error handling, the launcher's and the CPU request, the metrics folder, then the user's extraEnv. */}}
{{- define "megdet.env" -}}
{{- $n := .Values.nccl -}}
{{- $env := list (dict "name" "TORCH_NCCL_ASYNC_ERROR_HANDLING" "value" (toString (int64 $n.asyncErrorHandling))) -}}
{{- /* For `megdet launch` (docs/image.md): torchrun's shutdown timeout, restarts, rendezvous id. */ -}}
{{- $env = append $env (dict "name" "MEGDET_GRACE_PERIOD_SECONDS" "value" (toString (int64 .Values.terminationGracePeriodSeconds))) -}}
{{- $env = append $env (dict "name" "MEGDET_MAX_RESTARTS" "value" (toString (int64 .Values.workerRestarts))) -}}
{{- $env = append $env (dict "name" "MEGDET_RUN_ID" "value" (include "megdet.fullname" .)) -}}
{{- /* The pod's CPU request, which the trainer's CPU workers share (trainer/workers.py). */ -}}
{{- $env = append $env (dict "name" "MEGDET_POD_MILLICPUS" "valueFrom" (dict "resourceFieldRef" (dict "resource" "requests.cpu" "divisor" "1m"))) -}}
{{- if $n.debug -}}{{- $env = append $env (dict "name" "NCCL_DEBUG" "value" $n.debug) -}}{{- end -}}
{{- if $n.debugSubsys -}}{{- $env = append $env (dict "name" "NCCL_DEBUG_SUBSYS" "value" $n.debugSubsys) -}}{{- end -}}
{{- if $n.socketIfname -}}{{- $env = append $env (dict "name" "NCCL_SOCKET_IFNAME" "value" $n.socketIfname) -}}{{- end -}}
{{- if $n.ib.enabled -}}
{{- $env = append $env (dict "name" "NCCL_IB_DISABLE" "value" "0") -}}
{{- if $n.ib.hca -}}{{- $env = append $env (dict "name" "NCCL_IB_HCA" "value" $n.ib.hca) -}}{{- end -}}
{{- if not (kindIs "invalid" $n.ib.gidIndex) -}}{{- $env = append $env (dict "name" "NCCL_IB_GID_INDEX" "value" (toString (int64 $n.ib.gidIndex))) -}}{{- end -}}
{{- if not (kindIs "invalid" $n.ib.timeout) -}}{{- $env = append $env (dict "name" "NCCL_IB_TIMEOUT" "value" (toString (int64 $n.ib.timeout))) -}}{{- end -}}
{{- if not (eq (toString $n.ib.gdrLevel) "") -}}{{- $env = append $env (dict "name" "NCCL_NET_GDR_LEVEL" "value" (include "megdet.pyValue" $n.ib.gdrLevel)) -}}{{- end -}}
{{- else -}}
{{- $env = append $env (dict "name" "NCCL_IB_DISABLE" "value" "1") -}}
{{- end -}}
{{- if .Values.metrics.enabled -}}
{{- /* prometheus_client's multiprocess folder: every rank of the pod writes its metrics there
       and local rank 0 serves them all on the metrics port (trainer/metrics.py). */ -}}
{{- $env = append $env (dict "name" "PROMETHEUS_MULTIPROC_DIR" "value" "/tmp/megdet-metrics") -}}
{{- end -}}
{{- $env = concat $env (include "megdet.progressEnv" . | fromYamlArray) -}}
{{- $env = concat $env .Values.extraEnv -}}
{{- include "megdet.yaml" $env -}}
{{- end -}}

{{/*
Progress reporting (target pytorchjob, progress.url set by the controller): the trainer POSTs
Kubeflow Trainer's status protocol to the controller (docs/architecture.md, "Progress
reporting"). The env names are Trainer v2's (kubeflow/trainer v2.3.0
pkg/runtime/framework/plugins/trainjobstatus/trainjobstatus.go), so the trainer has one
reporting path for both targets. The token is a projected ServiceAccount token whose audience
is this run's, with the run's uid in it (megdet/progress.py run_audience: a run created again
under the same name refuses the old run's tokens; the API server refuses such a token for its
own API; automountServiceAccountToken stays false), rotated by the kubelet; the CA comes from
the controller's ConfigMap.
*/}}
{{- define "megdet.progressEnabled" -}}
{{- if and .Values.progress.url (eq .Values.target "pytorchjob") -}}true{{- end -}}
{{- end -}}
{{- define "megdet.progressMountPath" -}}/var/run/secrets/megdet.io/progress{{- end -}}
{{- define "megdet.progressAudience" -}}
{{- printf "megdet.io/v1alpha1/namespaces/%s/megdetruns/%s/status/%s" .Release.Namespace .Release.Name .Values.progress.runUID -}}
{{- end -}}
{{/*
The egress rule the progress reports need under networkPolicy.restrictEgress (empty without
progress): TCP to progress.url's port (443 if it names none). A URL of a cluster Service
(https://<service>.<namespace>.svc[.<cluster domain>][:<port>], what the operator chart passes)
also names the peer: the controller's pods in that namespace (app.kubernetes.io/part-of=megdet,
app.kubernetes.io/component=controller: every replica serves the reports and the progress
Service selects them all). Any other host: the port at any destination. A policy matches
the Service's endpoints, not its cluster IP (kube-proxy translates first), so the container port
must equal the URL's, as in the operator chart.
*/}}
{{- define "megdet.progressEgress" -}}
{{- if include "megdet.progressEnabled" . -}}
{{- $host := (urlParse .Values.progress.url).host -}}
{{- $port := 443 -}}
{{- if regexMatch ":[0-9]+$" $host -}}
{{- $port = regexFind "[0-9]+$" $host | int64 -}}
{{- $host = regexReplaceAll ":[0-9]+$" $host "" -}}
{{- end -}}
{{- $rule := dict "ports" (list (dict "protocol" "TCP" "port" $port)) -}}
{{- $service := regexFind "^[a-z0-9]([-a-z0-9]*[a-z0-9])?\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?\\.svc(\\..*)?$" $host -}}
{{- if $service -}}
{{- $ns := index (splitList "." $service) 1 -}}
{{- $peer := dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" $ns)) "podSelector" (dict "matchLabels" (dict "app.kubernetes.io/part-of" "megdet" "app.kubernetes.io/component" "controller")) -}}
{{- $_ := set $rule "to" (list $peer) -}}
{{- end -}}
{{- toYaml $rule -}}
{{- end -}}
{{- end -}}

{{- define "megdet.progressEnv" -}}
{{- if include "megdet.progressEnabled" . -}}
{{- if not .Values.progress.caConfigMap -}}
{{- fail "progress.url is set but progress.caConfigMap is empty: the pods need the endpoint's CA (a ConfigMap with key ca.crt)" -}}
{{- end -}}
{{- if not .Values.progress.runUID -}}
{{- fail "progress.url is set but progress.runUID is empty: the token audience names the run's uid" -}}
{{- end -}}
{{- $dir := include "megdet.progressMountPath" . -}}
{{- include "megdet.yaml" (list
  (dict "name" "KUBEFLOW_TRAINER_SERVER_URL" "value" (printf "%s/apis/megdet.io/v1alpha1/namespaces/%s/megdetruns/%s/status" (trimSuffix "/" .Values.progress.url) .Release.Namespace .Release.Name))
  (dict "name" "KUBEFLOW_TRAINER_SERVER_CA_CERT" "value" (printf "%s/ca.crt" $dir))
  (dict "name" "KUBEFLOW_TRAINER_SERVER_TOKEN" "value" (printf "%s/token" $dir))) -}}
{{- else -}}
[]
{{- end -}}
{{- end -}}

{{/*
Per-pod resources: GPUs (and RDMA with IB) in requests and limits alike. resources.qos=Guaranteed
(the default) also sets CPU and memory limits equal to the requests, so the kubelet's static CPU
manager can give the container whole CPUs and the topology manager can align them with the
GPUs and HCAs (docs/helm.md). Burstable sets only the requests (and resources.memoryLimit).
*/}}
{{- define "megdet.resources" -}}
{{- $v := .root.Values -}}
{{- $gpu := dict $v.gpuResource (int64 .plan.procsPerNode) -}}
{{- $requests := merge (dict "cpu" (toString $v.resources.cpu) "memory" (toString $v.resources.memory)) $gpu -}}
{{- $limits := deepCopy $gpu -}}
{{- if $v.nccl.ib.enabled -}}
{{- $_ := set $requests $v.nccl.ib.rdmaResourceName (int64 $v.nccl.ib.rdmaResourceCount) -}}
{{- $_ := set $limits $v.nccl.ib.rdmaResourceName (int64 $v.nccl.ib.rdmaResourceCount) -}}
{{- end -}}
{{- if eq $v.resources.qos "Guaranteed" -}}
{{- $_ := set $limits "cpu" (toString $v.resources.cpu) -}}
{{- $_ := set $limits "memory" (toString $v.resources.memory) -}}
{{- else if $v.resources.memoryLimit -}}
{{- $_ := set $limits "memory" (toString $v.resources.memoryLimit) -}}
{{- end -}}
{{- include "megdet.yaml" (dict "requests" $requests "limits" $limits) -}}
{{- end -}}

{{/*
The container's securityContext: containerSecurityContext (values.yaml holds the defaults, which
meet the `restricted` Pod Security Standard: non-root, no privilege escalation, every capability
dropped, the runtime's default seccomp profile), with what nccl.ib.memlock=root needs on top.

RDMA pins its buffers, which needs an unlimited RLIMIT_MEMLOCK or an effective CAP_IPC_LOCK. An
added capability never reaches the effective set of a non-root process
(kubernetes/kubernetes#56374), so IPC_LOCK is added only with memlock=root, where the container
runs as uid 0; that mode also gives root the runtime's default capabilities back (drop ALL is
taken out of the list: uid 0 without CAP_DAC_OVERRIDE could not write the image user's home)
but NET_RAW (unless containerSecurityContext adds it), which RDMA's reliable-connection queue
pairs (what NCCL uses) do not need and which would let root craft and sniff packets (on the
node's interfaces with network.hostNetwork); it needs a `privileged` namespace (docs/helm.md,
"Pod security"). With memlock=runtime the container keeps the image's user and the node's
runtime must grant the limit.
*/}}
{{- define "megdet.containerSecurityContext" -}}
{{- $v := .Values -}}
{{- $sc := deepCopy (default (dict) $v.containerSecurityContext) -}}
{{- $ib := $v.nccl.ib -}}
{{- if and $ib.enabled (eq $ib.memlock "root") -}}
{{- $caps := deepCopy (default (dict) $sc.capabilities) -}}
{{- $_ := set $caps "add" (append (without (default (list) $caps.add) "IPC_LOCK") "IPC_LOCK") -}}
{{- $drop := without (default (list) $caps.drop) "ALL" "NET_RAW" -}}
{{- if not (has "NET_RAW" $caps.add) -}}{{- $drop = append $drop "NET_RAW" -}}{{- end -}}
{{- if $drop -}}{{- $_ := set $caps "drop" $drop -}}{{- else -}}{{- $_ := unset $caps "drop" -}}{{- end -}}
{{- $_ := set $sc "capabilities" $caps -}}
{{- $_ := set $sc "runAsUser" 0 -}}
{{- $_ := set $sc "runAsNonRoot" false -}}
{{- end -}}
{{- with $sc -}}{{- include "megdet.yaml" . -}}{{- end -}}
{{- end -}}

{{/* The pod's labels: the run's selector labels, its component (.role), then podLabels (which
megdet.validatePodMetadata keeps off the chart's and the operators' keys). */}}
{{- define "megdet.podLabels" -}}
{{- $root := .root -}}
{{- $labels := dict "app.kubernetes.io/name" (include "megdet.name" $root) "app.kubernetes.io/instance" $root.Release.Name -}}
{{- $_ := set $labels "app.kubernetes.io/component" .role -}}
{{- $_ := set $labels "app.kubernetes.io/part-of" "megdet" -}}
{{- include "megdet.yaml" (merge $labels (default (dict) $root.Values.podLabels)) -}}
{{- end -}}

{{/*
The pod template shared by the PyTorchJob's Master and Worker and the TrainJob's runtime.
.role is master, worker or node (app.kubernetes.io/component); .container is the container's
name (default pytorch); .restartPolicy, when set, is written into the pod spec (Trainer v2's
Job pods; the v1 operator sets it itself from the replica's).
*/}}
{{- define "megdet.podTemplate" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
metadata:
  labels:
    {{- include "megdet.podLabels" . | nindent 4 }}
  {{- $annotations := deepCopy (default (dict) $v.podAnnotations) }}
  {{- if $v.network.multusNetworks }}
  {{- $_ := set $annotations "k8s.v1.cni.cncf.io/networks" $v.network.multusNetworks }}
  {{- end }}
  {{- with $annotations }}
  annotations:
    {{- include "megdet.yaml" . | nindent 4 }}
  {{- end }}
spec:
  {{- with .restartPolicy }}
  restartPolicy: {{ . | quote }}
  {{- end }}
  {{- if $v.network.hostNetwork }}
  hostNetwork: true
  dnsPolicy: "ClusterFirstWithHostNet"
  {{- end }}
  {{- if $v.gang.enabled }}
  schedulerName: {{ $v.gang.schedulerName | quote }}
  {{- end }}
  {{- with $v.priorityClassName }}
  priorityClassName: {{ . | quote }}
  {{- end }}
  {{- /* The trainer checkpoints on SIGTERM; the pod must live long enough to write it. */}}
  terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds | int64 }}
  {{- with $v.podSecurityContext }}
  securityContext:
    {{- include "megdet.yaml" . | nindent 4 }}
  {{- end }}
  {{- with $v.serviceAccountName }}
  serviceAccountName: {{ . | quote }}
  {{- end }}
  {{- /* The trainer never calls the Kubernetes API: no token in the pod. */}}
  automountServiceAccountToken: false
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- include "megdet.yaml" . | nindent 4 }}
  {{- end }}
  {{- with $v.nodeSelector }}
  nodeSelector:
    {{- include "megdet.yaml" . | nindent 4 }}
  {{- end }}
  {{- with $v.tolerations }}
  tolerations:
    {{- include "megdet.yaml" . | nindent 4 }}
  {{- end }}
  {{- with $v.affinity }}
  affinity:
    {{- include "megdet.yaml" . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ default "pytorch" .container | quote }}
      image: {{ include "megdet.image" $root | quote }}
      imagePullPolicy: {{ $v.image.pullPolicy | quote }}
      {{- if $v.metrics.enabled }}
      ports:
        - name: metrics
          containerPort: {{ $v.metrics.port | int64 }}
          protocol: TCP
      {{- end }}
      args:
        {{- include "megdet.trainArgs" $root | nindent 8 }}
      env:
        {{- include "megdet.env" $root | nindent 8 }}
      resources:
        {{- include "megdet.resources" . | nindent 8 }}
      {{- with include "megdet.containerSecurityContext" $root }}
      securityContext:
        {{- . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: data
          mountPath: /data
          readOnly: true
        - name: output
          mountPath: /output
        - name: dshm
          mountPath: /dev/shm
        {{- if include "megdet.progressEnabled" $root }}
        - name: megdet-progress
          mountPath: {{ include "megdet.progressMountPath" $root | quote }}
          readOnly: true
        {{- end }}
        {{- with $v.extraVolumeMounts }}
        {{- include "megdet.yaml" . | nindent 8 }}
        {{- end }}
  volumes:
    - name: data
      persistentVolumeClaim:
        claimName: {{ $v.dataset.claimName | quote }}
        readOnly: true
    - name: output
      persistentVolumeClaim:
        claimName: {{ $v.output.claimName | quote }}
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $v.shm.sizeLimit | quote }}
    {{- if include "megdet.progressEnabled" $root }}
    - name: megdet-progress
      projected:
        sources:
          - serviceAccountToken:
              audience: {{ include "megdet.progressAudience" $root | quote }}
              expirationSeconds: 3600
              path: token
          - configMap:
              name: {{ $v.progress.caConfigMap | quote }}
              items:
                - key: ca.crt
                  path: ca.crt
    {{- end }}
    {{- with $v.extraVolumes }}
    {{- include "megdet.yaml" . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/*
The Pod Security Standards level the run's pod meets, for NOTES: YAML with `level`
(restricted, baseline or privileged) and `baseline` and `restricted`: what fails each level, in
words naming the values. The checks are the standards' (kubernetes/website
content/en/docs/concepts/security/pod-security-standards.md, level "latest") for the fields the
chart renders; tests/chart/pod_security.py implements the same checks and a test holds the two
equal.
*/}}
{{- define "megdet.podSecurity" -}}
{{- $pod := include "megdet.podTemplate" (dict "root" . "plan" (include "megdet.plan" . | fromYaml) "role" "master") | fromYaml -}}
{{- $spec := $pod.spec -}}
{{- $psc := default (dict) $spec.securityContext -}}
{{- $ib := .Values.nccl.ib -}}
{{- $rootMode := and $ib.enabled (eq $ib.memlock "root") -}}
{{- $baseline := list -}}
{{- $restricted := list -}}
{{- if or $spec.hostNetwork $spec.hostPID $spec.hostIPC -}}
{{- $baseline = append $baseline "network.hostNetwork=true (host namespaces)" -}}
{{- end -}}
{{- range $key, $value := default (dict) $pod.metadata.annotations -}}
{{- if and (hasPrefix "container.apparmor.security.beta.kubernetes.io/" $key) (ne $value "runtime/default") (not (hasPrefix "localhost/" $value)) -}}
{{- $baseline = append $baseline (printf "podAnnotations: %s=%s" $key $value) -}}
{{- end -}}
{{- end -}}
{{- range $spec.volumes -}}
{{- if hasKey . "hostPath" -}}
{{- $baseline = append $baseline (printf "extraVolumes: %s is a hostPath volume" .name) -}}
{{- else if not (has (first (without (keys .) "name")) (list "configMap" "csi" "downwardAPI" "emptyDir" "ephemeral" "persistentVolumeClaim" "projected" "secret")) -}}
{{- $restricted = append $restricted (printf "extraVolumes: %s is a %s volume" .name (first (without (keys .) "name"))) -}}
{{- end -}}
{{- end -}}
{{- $what := ternary "nccl.ib.memlock=root" "containerSecurityContext" $rootMode -}}
{{- range $spec.containers -}}
{{- $sc := default (dict) .securityContext -}}
{{- range .ports -}}
{{- if .hostPort -}}{{- $baseline = append $baseline "a hostPort" -}}{{- end -}}
{{- end -}}
{{- if $sc.privileged -}}{{- $baseline = append $baseline (printf "%s: privileged" $what) -}}{{- end -}}
{{- $caps := default (dict) $sc.capabilities -}}
{{- $add := default (list) $caps.add -}}
{{- $beyond := list -}}
{{- range $add -}}
{{- if not (has . (list "AUDIT_WRITE" "CHOWN" "DAC_OVERRIDE" "FOWNER" "FSETID" "KILL" "MKNOD" "NET_BIND_SERVICE" "SETFCAP" "SETGID" "SETPCAP" "SETUID" "SYS_CHROOT")) -}}{{- $beyond = append $beyond . -}}{{- end -}}
{{- end -}}
{{- if $beyond -}}{{- $baseline = append $baseline (printf "%s: capabilities.add %s" $what (join "," $beyond)) -}}{{- end -}}
{{- if eq (dig "procMount" "Default" $sc) "Default" | not -}}{{- $baseline = append $baseline (printf "%s: procMount %s" $what $sc.procMount) -}}{{- end -}}
{{- range $where, $ctx := dict "podSecurityContext" $psc $what $sc -}}
{{- if eq (dig "appArmorProfile" "type" "" $ctx) "Unconfined" -}}{{- $baseline = append $baseline (printf "%s: appArmorProfile Unconfined" $where) -}}{{- end -}}
{{- if eq (dig "seccompProfile" "type" "" $ctx) "Unconfined" -}}{{- $baseline = append $baseline (printf "%s: seccompProfile Unconfined" $where) -}}{{- end -}}
{{- with $ctx.seLinuxOptions -}}
{{- if or .user .role (not (has (default "" .type) (list "" "container_t" "container_init_t" "container_kvm_t" "container_engine_t"))) -}}{{- $baseline = append $baseline (printf "%s: seLinuxOptions" $where) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if ne (toString (dig "allowPrivilegeEscalation" "" $sc)) "false" -}}{{- $restricted = append $restricted (printf "%s: allowPrivilegeEscalation is not false" $what) -}}{{- end -}}
{{- $nonRoot := ternary $sc.runAsNonRoot $psc.runAsNonRoot (hasKey $sc "runAsNonRoot") -}}
{{- if or (ne (toString $nonRoot) "true") (eq (toString $psc.runAsNonRoot) "false") -}}{{- $restricted = append $restricted (printf "%s: runAsNonRoot is not true" $what) -}}{{- end -}}
{{- if or (eq (toString $sc.runAsUser) "0") (eq (toString $psc.runAsUser) "0") -}}{{- $restricted = append $restricted (printf "%s: runs as root (runAsUser 0)" $what) -}}{{- end -}}
{{- $seccomp := dig "seccompProfile" "type" (dig "seccompProfile" "type" "" $psc) $sc -}}
{{- $podSeccomp := dig "seccompProfile" "type" "RuntimeDefault" $psc -}}
{{- if not (and (has $seccomp (list "RuntimeDefault" "Localhost")) (has $podSeccomp (list "RuntimeDefault" "Localhost"))) -}}{{- $restricted = append $restricted (printf "%s: seccompProfile is not RuntimeDefault or Localhost" $what) -}}{{- end -}}
{{- if or (not (has "ALL" (default (list) $caps.drop))) (without $add "NET_BIND_SERVICE") -}}{{- $restricted = append $restricted (printf "%s: capabilities do not drop ALL and add at most NET_BIND_SERVICE" $what) -}}{{- end -}}
{{- end -}}
{{- range (default (list) $psc.sysctls) -}}
{{- if not (has .name (list "kernel.shm_rmid_forced" "net.ipv4.ip_local_port_range" "net.ipv4.ip_unprivileged_port_start" "net.ipv4.tcp_syncookies" "net.ipv4.ping_group_range" "net.ipv4.ip_local_reserved_ports" "net.ipv4.tcp_keepalive_time" "net.ipv4.tcp_fin_timeout" "net.ipv4.tcp_keepalive_intvl" "net.ipv4.tcp_keepalive_probes")) -}}{{- $baseline = append $baseline (printf "podSecurityContext: sysctl %s" .name) -}}{{- end -}}
{{- end -}}
level: {{ ternary "privileged" (ternary "baseline" "restricted" (gt (len $restricted) 0)) (gt (len $baseline) 0) | quote }}
baseline: {{ $baseline | toJson }}
restricted: {{ $restricted | toJson }}
{{- end -}}
