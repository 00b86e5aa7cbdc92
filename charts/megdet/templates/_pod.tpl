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
  "MEGDET.METRICS.PORT" (ternary (toString (int64 $v.metrics.port)) "0" $v.metrics.enabled)) -}}
{{- /* `megdet train --num-workers` spawns processes; torchrun does that in a pod, so
       DataLoader workers go through detectron2's own key. */ -}}
{{- if not (kindIs "invalid" $v.numWorkers) -}}
{{- $args = concat $args (list "DATALOADER.NUM_WORKERS" (toString (int64 $v.numWorkers))) -}}
{{- end -}}
{{- range $key, $value := $v.extraOverrides -}}
{{- $args = concat $args (list $key (include "megdet.pyValue" $value)) -}}
{{- end -}}
{{- toYaml $args -}}
{{- end -}}

{{/* Container env: NCCL transport, error handling, the metrics folder, then the user's extraEnv. */}}
{{- define "megdet.env" -}}
{{- $n := .Values.nccl -}}
{{- $env := list (dict "name" "TORCH_NCCL_ASYNC_ERROR_HANDLING" "value" (toString (int64 $n.asyncErrorHandling))) -}}
{{- /* For `megdet launch` (docs/image.md): torchrun's shutdown timeout, restarts, rendezvous id. */ -}}
{{- $env = append $env (dict "name" "MEGDET_GRACE_PERIOD_SECONDS" "value" (toString (int64 .Values.terminationGracePeriodSeconds))) -}}
{{- $env = append $env (dict "name" "MEGDET_MAX_RESTARTS" "value" (toString (int64 .Values.workerRestarts))) -}}
{{- $env = append $env (dict "name" "MEGDET_RUN_ID" "value" (include "megdet.fullname" .)) -}}
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
{{- $env = concat $env .Values.extraEnv -}}
{{- toYaml $env -}}
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
{{- toYaml (dict "requests" $requests "limits" $limits) -}}
{{- end -}}

{{/*
The container's securityContext for InfiniBand, or nothing. RDMA pins its buffers, which needs
an unlimited RLIMIT_MEMLOCK or an effective CAP_IPC_LOCK. An added capability never reaches
the effective set of a non-root process (kubernetes/kubernetes#56374), so IPC_LOCK is added only
with nccl.ib.memlock=root, where the container runs as uid 0; with memlock=runtime the
container keeps the image's user and the node's runtime must grant the limit (docs/helm.md).
*/}}
{{- define "megdet.containerSecurityContext" -}}
{{- $ib := .Values.nccl.ib -}}
{{- if and $ib.enabled (eq $ib.memlock "root") -}}
runAsUser: 0
runAsNonRoot: false
capabilities:
  add: ["IPC_LOCK"]
{{- end -}}
{{- end -}}

{{/* The pod template shared by Master and Worker; .role is master or worker. */}}
{{- define "megdet.podTemplate" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
metadata:
  labels:
    {{- include "megdet.selectorLabels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .role }}
    app.kubernetes.io/part-of: megdet
    {{- with $v.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- $annotations := deepCopy $v.podAnnotations }}
  {{- if $v.network.multusNetworks }}
  {{- $_ := set $annotations "k8s.v1.cni.cncf.io/networks" $v.network.multusNetworks }}
  {{- end }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- if $v.network.hostNetwork }}
  hostNetwork: true
  dnsPolicy: ClusterFirstWithHostNet
  {{- end }}
  {{- if $v.gang.enabled }}
  schedulerName: {{ $v.gang.schedulerName }}
  {{- end }}
  {{- with $v.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- /* The trainer checkpoints on SIGTERM; the pod must live long enough to write it. */}}
  terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
  {{- with $v.podSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.serviceAccountName }}
  serviceAccountName: {{ . }}
  {{- end }}
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: pytorch
      image: {{ include "megdet.image" $root }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
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
        {{- with $v.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: data
      persistentVolumeClaim:
        claimName: {{ $v.dataset.claimName }}
        readOnly: true
    - name: output
      persistentVolumeClaim:
        claimName: {{ $v.output.claimName }}
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $v.shm.sizeLimit }}
    {{- with $v.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
