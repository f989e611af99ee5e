{{- define "gpu-mem.name" -}}{{ .Release.Name }}-gpu-mem{{- end -}}
{{- define "gpu-mem.labels" -}}
app.kubernetes.io/name: gpu-mem
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}
{{- define "gpu-mem.selector" -}}
app.kubernetes.io/name: gpu-mem
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
