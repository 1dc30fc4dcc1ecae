# mmdeploy-format deploy config: ObjectDetection (mmdet) for ONNX Runtime,
# dynamic batch (image size of the model config).
# Used by tools/deploy/export_onnx.py --deploy-cfg (docs/deploy.md); opset 17.
onnx_config = dict(
    type='onnx', export_params=True, keep_initializers_as_inputs=False, opset_version=17,
    save_file='end2end.onnx', input_names=['input'], output_names=['cls_score', 'bbox_pred'],
    input_shape=None, dynamic_axes=dict(input={0: 'batch'}))
codebase_config = dict(type='mmdet', task='ObjectDetection')
backend_config = dict(type='onnxruntime')
