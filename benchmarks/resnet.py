"""ResNet-50 in PyTorch, torchvision's layout (v1.5: the stride on the 3 x 3 convolution), 25,557,032 parameters.

Written here because timm and torchvision are not installed (timm imports
torchvision, and installing either would replace the CPU build of torch).
Bottleneck blocks [3, 4, 6, 3] of widths 64, 128, 256, 512 (x 4 out),
BatchNorm after every convolution, a 1,000-class head.
"""

from torch import nn
from torch.nn import functional


class Bottleneck(nn.Module):
    """1 x 1 reduce, 3 x 3 (strided), 1 x 1 expand by 4, plus the shortcut (projected when the shape changes)."""

    def __init__(self, inplanes, planes, stride):
        super().__init__()
        out = planes * 4
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        h = functional.relu(self.bn1(self.conv1(x)))
        h = functional.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return functional.relu(h + (x if self.downsample is None else self.downsample(x)))


def resnet50(classes=1000):
    """ResNet-50 as one ``nn.Sequential``: stem, 16 bottlenecks, global average pool, linear head."""
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    inplanes = 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(inplanes, planes, stride if i == 0 else 1))
            inplanes = planes * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, classes)]
    return nn.Sequential(*layers)
